"""Shared fixtures: real processes, real compiles (cross-compiled for sm_90 on the CPU)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import user_store_guard

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
# Background compile workers would add compiles (and CPU load) to every test that counts
# them; the compile-ahead tests turn it on where they test it.
os.environ.setdefault("FA4CACHE_COMPILE_AHEAD", "0")
# One base seed per run, drawn here so that xdist workers (which inherit the environment)
# share it; printed in the header so that any run can be replayed.
os.environ.setdefault("FA4CACHE_FUZZ_SEED", str(random.SystemRandom().randrange(1 << 30)))

# The suite never writes the user's store (tests/helpers/user_store_guard.py): the run's first
# process (pytest-xdist's controller) notes the user's stores and points FA4CACHE_DIR at a
# store of the run's own, which its workers and every child process inherit; each process
# refuses its own writes under the user's stores, and the test that tried fails.
_RUN_STORE: str | None = None  # made by this process: removed when it ends
if user_store_guard.ENV not in os.environ:
    _RUN_STORE = tempfile.mkdtemp(prefix="fa4cache-suite-store-")
    os.environ[user_store_guard.ENV] = os.pathsep.join(user_store_guard.user_stores())
    os.environ["FA4CACHE_DIR"] = _RUN_STORE
user_store_guard.guard(user_store_guard.user_stores())


def pytest_report_header(config: Any) -> str:
    return f"FA4CACHE_FUZZ_SEED={os.environ['FA4CACHE_FUZZ_SEED']} (set it to replay the random cases)"


@pytest.fixture(autouse=True)
def _never_the_users_store() -> Any:
    """Fail the test that tried to write the user's store (the write itself was refused)."""
    user_store_guard.take_refused()  # what came before this test is not its doing
    yield
    refused = user_store_guard.take_refused()
    if refused:
        pytest.fail(
            "this test tried to write the user's store "
            f"({os.environ[user_store_guard.ENV]}); give it a store of its own (tmp_path):\n"
            + "\n".join(refused[:10]),
            pytrace=False,
        )


def pytest_unconfigure(config: Any) -> None:
    # The run's own store goes with the process that made it (workers share it).
    if _RUN_STORE is not None:
        shutil.rmtree(_RUN_STORE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_patch_check() -> Any:
    """fa4cache checks once per process whether FA4's code was replaced at run time
    (fa4cache.patched_code); a test that patches FA4 undoes it when it ends, so the next test
    is checked afresh, as its own process would be."""
    yield
    from fa4cache import patched_code

    patched_code.forget()


def have_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if have_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200: benchmarks/gpu_run.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def worker_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["FA4CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def start_worker(cache_dir: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.worker", *args],
        cwd=ROOT,
        env=worker_env(cache_dir, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-4000:]}"
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"worker printed no result:\n{out[-2000:]}\n{err[-2000:]}"
    res = json.loads(lines[-1][len("RESULT ") :])
    res["stderr"] = err
    return res


def run_worker(cache_dir: Path, *args: str, **env: str) -> dict[str, Any]:
    return finish(start_worker(cache_dir, *args, **env))


def run_results(
    module: str, cache_dir: Path, *args: str, timeout: float = 900, **env: str
) -> list[dict[str, Any]]:
    """``python -m module ARGS`` against the store ``cache_dir``: every ``RESULT`` line it
    printed, in order, each with the process's stderr (a worker that prints one per step)."""
    p = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=worker_env(cache_dir, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    rows = [json.loads(ln[len("RESULT ") :]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert rows, p.stdout[-3000:] + p.stderr[-3000:]
    for row in rows:
        row["stderr"] = p.stderr
    return rows


def run_cli(
    cache_dir: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fa4cache", "--cache-dir", str(cache_dir), *args],
        cwd=ROOT,
        env=worker_env(cache_dir, **(env or {})),
        capture_output=True,
        text=True,
        input=input,
        timeout=900,
    )


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """``build(folder)`` once per test run, shared by pytest-xdist's workers: the first
    worker to ask builds it under a file lock, the others wait and read what it built
    (a worker's own session fixture would compile the same kernels once per worker). The
    folder is the fixture's to fill; ``build``'s result (JSON) travels with it. Whatever is
    built this way is read, never changed, by the tests: copy it to change it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder, done = base / f"once-{name}", base / f"once-{name}.json"
    with FileLock(str(base / f"once-{name}.lock")):
        if not done.exists():
            # What a worker that failed mid-build left is built again, not used.
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            staged = done.with_suffix(".tmp")
            staged.write_text(json.dumps(build(folder)))
            os.replace(staged, done)
        return folder, json.loads(done.read_text())


@pytest.fixture(scope="session")
def doc_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store filled by one real process: 20 random document layouts, forward+backward.

    This is the suite's one cold compile of the document-mask kernel set (once per run,
    whatever the workers); tests copy the directory rather than compile again.
    """

    def build(folder: Path) -> dict[str, Any]:
        return run_worker(
            folder / "cache", "geometries", "--geometries", "20", "--seed", "7", PYTHONHASHSEED="1"
        )

    folder, res = once_per_run(tmp_path_factory, "doc_store", build)
    return {"dir": folder / "cache", "result": res}


@pytest.fixture(scope="session")
def causal_fwd_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store with one real FA4 forward kernel (causal), cross-compiled for sm_90 by one
    process, once per run."""

    def build(folder: Path) -> dict[str, Any]:
        return run_worker(folder / "cache", "compile", "--mask", "causal", "--seqlen", "512", "--no-backward")

    folder, res = once_per_run(tmp_path_factory, "causal_fwd", build)
    return {"dir": folder / "cache", "result": res}


@pytest.fixture
def doc_store_copy(doc_store: dict[str, Any], tmp_path: Path) -> Path:
    return copy_store(doc_store["dir"], tmp_path / "cache")


def copy_store(src: Path, dst: Path) -> Path:
    """A test's own copy of a shared store (:func:`once_per_run`'s are read only)."""
    shutil.copytree(src, dst, symlinks=True)
    # Counters belong to the original process; a copy starts with none.
    shutil.rmtree(dst / "stats")
    (dst / "stats").mkdir(mode=0o700)
    return dst


# ------------------------------------------------------------------ the fault table
# Fault-injection tests (tests/store/test_faults.py, tests/adapters/fa4/test_fail_open.py) each
# record what was injected and what happened; the table is printed at the end of the run.
_FAULT_ROWS: list[tuple[str, ...]] = []


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Any:
    # Through the test's report: under pytest-xdist the rows reach the controller that
    # prints the table, not only the worker that ran the test.
    def add(fault: str, injected: str, outcome: str) -> None:
        request.node.user_properties.append(("fault_row", (fault, injected, outcome)))

    return add


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":  # a test's properties so far, every row once
        _FAULT_ROWS.extend(tuple(v) for k, v in report.user_properties if k == "fault_row")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FAULT_ROWS:
        return
    tr = terminalreporter
    tr.section("fa4cache fault injection: what was injected, what happened")
    tr.write_line("| fault | injected | outcome |")
    tr.write_line("|---|---|---|")
    for row in _FAULT_ROWS:
        tr.write_line("| " + " | ".join(row) + " |")
