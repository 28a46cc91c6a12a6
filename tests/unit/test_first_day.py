"""A newcomer's first day (issue 52): no command destroys what a user did not mean, the
CLI says true things about the store, and the package is ready to be adopted.

Fast: the CLI runs in subprocesses (or through ``fa4cache.cli.main``) on stores written
through the real Store API (no compile); a terminal is a real pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fa4cache.settings import parse_duration, parse_size
from fa4cache.store.paths import LAYOUT, EntryRef
from fa4cache.store.store import Store
from tests.conftest import ROOT, run_cli, worker_env
from tests.store.test_other_users import _seed, people  # noqa: F401  (a fixture: two real users)

TC = "0123456789abcdef0123"
DAY = 86400.0


def _publish(store: Store, kind: str, n: int, size: int, used_ago: float) -> EntryRef:
    ref = EntryRef(TC, kind, f"{n:064x}")
    summary = {"dtype": "bf16", "head_dim": 128, "mask": "b2f70b3b0552"}
    assert store.publish_bytes(ref, b"\x7fELF" + bytes(size), summary=summary, compile_seconds=8.5)
    use = store.layout.use_path(ref)
    rec = json.loads(use.read_text()) if use.exists() else {"hits": 0}
    rec["last_used"] = time.time() - used_ago
    use.write_text(json.dumps(rec))
    return ref


@pytest.fixture
def four_kernels(tmp_path: Path) -> Path:
    """A store of four kernels: three used 2 days ago (small), one used now (large)."""
    root = tmp_path / "cache"
    store = Store.at(root)
    store.record_toolchain(TC, {"id": TC})
    _publish(store, "fwd", 1, 1000, 2 * DAY)
    _publish(store, "bwd", 2, 2000, 2 * DAY)
    _publish(store, "bwd_preprocess", 3, 500, 2 * DAY)
    _publish(store, "bwd_postprocess_convert", 4, 20_000, 10)
    return root


def _objects(root: Path) -> set[str]:
    return {p.stem for p in (root / LAYOUT).glob("*/*/*.o")}


def _on_terminal(root: Path, *args: str, answer: str) -> subprocess.CompletedProcess[str]:
    """The CLI with a real terminal as its stdin, on which ``answer`` is typed."""
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(
            [sys.executable, "-m", "fa4cache", "--cache-dir", str(root), *args],
            cwd=ROOT,
            env=worker_env(root),
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(slave)
        os.write(master, answer.encode())
        out, err = p.communicate(timeout=120)
    finally:
        os.close(master)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


# ---------------------------------------------------------------- 1: destructive commands


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["--older-than", "30"], "--older-than 30d"),
        (["--max-size", "2"], "--max-size 2G"),
        (["--max-size", "0"], "--max-size 0G"),
        (["--fingerprint", "stale", "--stale-after", "5"], "--stale-after 5d"),
    ],
)
def test_prune_refuses_a_bare_number_naming_the_argument_and_the_fix(
    four_kernels: Path, args: list[str], fix: str
) -> None:
    before = _objects(four_kernels)
    for extra in ([], ["--yes"], ["--dry-run"]):
        p = run_cli(four_kernels, "prune", *args, *extra)
        assert p.returncode == 2, (args, extra, p.stdout, p.stderr)
        line = p.stderr.strip()
        assert len(line.splitlines()) == 1 and "no unit" in line and fix in line, line
        assert line.startswith(f"fa4cache prune: {args[-2]}: "), line
    assert _objects(four_kernels) == before


def test_sizes_and_ages_with_units_parse() -> None:
    ages = {"30d": 30 * DAY, "12h": 12 * 3600, "90m": 90 * 60, "45s": 45, "2w": 14 * DAY}
    for text, seconds in ages.items():
        assert parse_duration(text, setting="--older-than") == seconds
    sizes = {"2G": 2 << 30, "500M": 500 << 20, "1024K": 1 << 20, "10B": 10, "1GiB": 1 << 30, "3kb": 3 << 10}
    for text, n in sizes.items():
        assert parse_size(text, setting="--max-size", unit_required=True) == n
    # A setting in the environment keeps its plain byte count (FA4CACHE_MAX_SIZE=1000000).
    assert parse_size("1000000", setting="FA4CACHE_MAX_SIZE") == 1000000


def test_prune_of_most_of_the_store_asks_on_a_terminal_and_refuses_without(four_kernels: Path) -> None:
    before = _objects(four_kernels)
    # 3 of 4 entries: refused without a terminal, naming --yes; nothing removed.
    p = run_cli(four_kernels, "prune", "--older-than", "1d")
    assert p.returncode == 2 and "--yes" in p.stderr and "3 entries" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert _objects(four_kernels) == before
    # On a terminal: asked; "n" keeps everything (exit 1), "y" removes the three.
    p = _on_terminal(four_kernels, "prune", "--older-than", "1d", answer="n\n")
    assert p.returncode == 1 and "Remove 3 entries" in p.stdout and "[y/N]" in p.stdout, p.stdout + p.stderr
    assert "nothing removed" in p.stdout and _objects(four_kernels) == before
    p = _on_terminal(four_kernels, "prune", "--older-than", "1d", answer="y\n")
    assert p.returncode == 0 and "removed 3 entries" in p.stdout, p.stdout + p.stderr
    assert len(_objects(four_kernels)) == 1


def test_prune_of_most_of_the_bytes_needs_yes(four_kernels: Path) -> None:
    # One entry of four, but most of the bytes (the large one, last used 5 days ago): asked too.
    (big,) = (four_kernels / LAYOUT).glob("*/bwd_postprocess_convert/*.use")
    big.write_text(json.dumps({**json.loads(big.read_text()), "last_used": time.time() - 5 * DAY}))
    p = run_cli(four_kernels, "prune", "--older-than", "4d")
    assert p.returncode == 2 and "--yes" in p.stderr and "remove 1 entry" in p.stderr, p.stderr
    assert len(_objects(four_kernels)) == 4
    p = run_cli(four_kernels, "prune", "--older-than", "4d", "--yes")
    assert p.returncode == 0 and "removed 1 entry" in p.stdout, p.stdout + p.stderr
    assert len(_objects(four_kernels)) == 3


def test_prune_of_a_small_part_runs_without_asking(four_kernels: Path) -> None:
    # The store is 23.0 KiB: fitting it into 22K removes the least recently used small entry.
    p = run_cli(four_kernels, "prune", "--max-size", "22K")
    assert p.returncode == 0 and "removed 1 entry" in p.stdout, p.stdout + p.stderr
    assert "Remove" not in p.stdout and len(_objects(four_kernels)) == 3


@pytest.mark.parametrize("args", [["--older-than", "1d"], ["--max-size", "21K"], ["--max-size", "0B"]])
def test_prune_dry_run_lists_exactly_what_the_run_removes(four_kernels: Path, args: list[str]) -> None:
    dry = run_cli(four_kernels, "prune", *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    listed = {ln.split()[3] for ln in dry.stdout.splitlines() if ln.startswith("would remove ")}
    assert listed, dry.stdout
    before = _objects(four_kernels)
    assert _objects(four_kernels) == before  # the dry run removed nothing
    real = run_cli(four_kernels, "prune", *args, "--yes")
    assert real.returncode == 0, real.stdout + real.stderr
    gone = before - _objects(four_kernels)
    assert {d[:16] for d in gone} == listed
    n = len(gone)
    assert f"would remove {n} entr" in dry.stdout and f"removed {n} entr" in real.stdout


def test_clear_refuses_without_a_terminal_and_asks_on_one(four_kernels: Path) -> None:
    p = run_cli(four_kernels, "clear")
    assert p.returncode == 2 and "--yes" in p.stderr and len(_objects(four_kernels)) == 4
    p = _on_terminal(four_kernels, "clear", answer="no\n")
    assert p.returncode == 1 and "[y/N]" in p.stdout and len(_objects(four_kernels)) == 4
    p = _on_terminal(four_kernels, "clear", answer="y\n")
    assert p.returncode == 0 and "removed 4 entries" in p.stdout and not _objects(four_kernels)


# ---------------------------------------------------------------- 11, 12: stats tells the truth


def test_stats_zero_on_a_read_only_store_is_one_friendly_line(people: Any) -> None:  # noqa: F811
    # As a user other than root (root writes into a mode-500 directory).
    victim, _, _ = people
    mine = victim.home / "ro-store"
    _seed(victim, mine)
    for d in (mine / "stats", mine):
        os.chmod(d, 0o500)
    p = victim.cli(mine, "stats", "--zero")
    assert p.returncode == 2, p.stdout + p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and "Errno" not in line and "Traceback" not in line, line
    assert line.startswith("fa4cache stats: ") and "not writable by you" in line, line
    st = victim.cli(mine, "stats", "--json")  # reading the numbers still works
    assert st.returncode == 0 and json.loads(st.stdout)["entries"] == 1, st.stderr


def test_stats_on_a_path_with_no_store_says_so_as_ls_and_verify_do(tmp_path: Path) -> None:
    missing = tmp_path / "mistyped"
    outs = {cmd: run_cli(missing, cmd) for cmd in ("stats", "ls", "verify")}
    for cmd, p in outs.items():
        assert p.returncode == 0 and p.stderr == "", (cmd, p.stderr)
        assert p.stdout.startswith(f"no store at {missing} yet: 0 entries"), (cmd, p.stdout)
    assert "Hit rate" not in outs["stats"].stdout
    st = run_cli(missing, "stats", "--json")  # a script still gets its numbers: zeros
    assert st.returncode == 0 and json.loads(st.stdout)["entries"] == 0
    z = run_cli(missing, "stats", "--zero")
    assert z.returncode == 0 and "no store at" in z.stdout, z.stdout + z.stderr
    assert not missing.exists()


# ---------------------------------------------------------------- 15: warm's lookups are not a job's


@pytest.mark.compile
def test_a_cold_warm_counts_compiles_not_hits_and_a_job_after_it_counts_its_hits(tmp_path: Path) -> None:
    from tests.conftest import run_worker

    d = tmp_path / "cache"
    manifest = tmp_path / "specs.json"
    # A forward and its backward: warm's workers look kernels up again after compiling them.
    manifest.write_text(json.dumps([{"mask": "document", "seqlen": 512}]))
    w = run_cli(d, "warm", "--manifest", str(manifest), "-j", "2")
    assert w.returncode == 0, w.stdout + w.stderr
    st = json.loads(run_cli(d, "stats", "--json").stdout)
    assert st["compiles"] == st["entries"] == 4, st
    assert (st["hits"], st["misses"], st["lock_waits"], st["hit_rate"]) == (0, 0, 0, None), st
    # A job after it: its lookups are the ones stats counts.
    r = run_worker(d, "compile", "--mask", "document", "--seqlen", "900", "--no-backward")
    assert r["compiles"] == 0 and r["disk_hits"] == 1, r
    st = json.loads(run_cli(d, "stats", "--json").stdout)
    assert st["disk_hits"] == 1 and st["misses"] == 0 and st["hit_rate"] == 1.0, st
    # Again, with --json (18): one summary on stdout for a script, the table on stderr.
    again = run_cli(d, "warm", "--manifest", str(manifest), "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    (row,) = summary["specs"]
    assert (row["compiles"], row["present"], row["error"]) == (0, 4, None) and row["spec"][
        "mask"
    ] == "document"
    assert summary["failed"] is False and summary["target"]["arch"] == "sm_90"
    assert "present" in again.stderr and "1 spec, 0 kernels compiled" in again.stderr
    assert json.loads(run_cli(d, "stats", "--json").stdout)["disk_hits"] == 1  # still only the job's


# ---------------------------------------------------------------- 7, 9, 20: an adoptable package


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_version_names_the_build_from_a_checkout_and_the_release_elsewhere(tmp_path: Path) -> None:
    import re
    import shutil

    import tomllib

    from fa4cache import version as v

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == v.RELEASE
    count, sha = _git("rev-list", "--count", "HEAD"), _git("rev-parse", "--short=7", "HEAD")
    want = rf"{re.escape(v.RELEASE)}\.dev{count}\+g{sha}(\.dirty)?"
    p = subprocess.run(
        [sys.executable, "-m", "fa4cache", "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert p.returncode == 0 and re.fullmatch(f"fa4cache {want}; flash-attn-4 .*", p.stdout.strip()), (
        p.stdout + p.stderr
    )
    # `import fa4cache` asks git nothing; the version is computed when first read.
    spy = (
        "import subprocess, sys\n"
        "calls = []\n"
        "real = subprocess.Popen.__init__\n"
        "def spy(self, *a, **k):\n    calls.append(a[0]); real(self, *a, **k)\n"
        "subprocess.Popen.__init__ = spy\n"
        "import fa4cache\n"
        "assert calls == [], calls\n"
        "print(fa4cache.__version__)\n"
    )
    p = subprocess.run([sys.executable, "-c", spy], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and re.fullmatch(want, p.stdout.strip()), p.stdout + p.stderr
    # Without git on PATH, and from a copy that is no checkout: the release.
    p = subprocess.run(
        [sys.executable, "-c", "import fa4cache; print(fa4cache.__version__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": str(tmp_path)},
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == v.RELEASE, p.stdout + p.stderr
    shutil.copytree(ROOT / "fa4cache", tmp_path / "site" / "fa4cache")
    p = subprocess.run(
        [sys.executable, "-c", "import fa4cache; print(fa4cache.__file__, fa4cache.__version__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.split() == [
        str(tmp_path / "site" / "fa4cache" / "__init__.py"),
        v.RELEASE,
    ], p.stdout + p.stderr


def test_the_license_file_and_py_typed_are_in_the_tree() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "the fa4cache authors" in text
    assert (ROOT / "fa4cache" / "py.typed").is_file()


@pytest.mark.slow
def test_the_wheel_carries_the_license_and_py_typed(tmp_path: Path) -> None:
    # The wheel itself, built as pyproject.toml says (about a minute on a busy 2-core machine).
    import zipfile

    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; pyproject.toml's build needs >= 77")
    import shutil

    # From a copy: pip builds in the source tree (build/, *.egg-info), and the checkout stays as it is.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "site")
    shutil.copytree(ROOT, src, ignore=skip)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w",
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (wheel,) = tmp_path.glob("fa4cache-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fa4cache/py.typed" in names
    (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: BSD-3-Clause" in meta and "License-File: LICENSE" in meta
    assert zipfile.ZipFile(wheel).read(lic).decode() == (ROOT / "LICENSE").read_text()


# ---------------------------------------------------------------- 10: a missing extra is named

_NO_TORCH = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "flash_attn", "cutlass", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
"""


def test_a_mask_in_a_base_install_names_the_extra(tmp_path: Path) -> None:
    code = _NO_TORCH + (
        "import fa4cache\n"
        "try:\n    fa4cache.make_document_mask([0, 3, 8])\n"
        "except fa4cache.FA4NotAvailable as e:\n    print('MASK', e)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.startswith("MASK ") and "pip install 'fa4cache[fa4]'" in p.stdout, p.stdout


def test_doctor_names_the_pip_line_for_a_missing_flash_attn_4(tmp_path: Path) -> None:
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.version\n"
        "def version(d):\n"
        "    if d == 'flash-attn-4':\n        raise m.PackageNotFoundError(d)\n"
        "    return real(d)\n"
        "m.version = version\n"
        "from fa4cache.cli import main\n"
        "sys.exit(main(['--cache-dir', sys.argv[1], 'doctor'] + sys.argv[2:]))\n"
    )
    d = tmp_path / "c"
    runs = [
        subprocess.run([sys.executable, "-c", code, str(d), *extra], cwd=ROOT, env=worker_env(d),
                       capture_output=True, text=True, timeout=600)
        for extra in ([], ["--json"])
    ]  # fmt: skip
    text, js = runs
    assert text.returncode == 1 and js.returncode == 1, text.stderr + js.stderr
    line = next(ln for ln in text.stdout.splitlines() if " flash-attn-4 " in ln)
    assert line.startswith("[FAIL]") and "not installed: pip install 'fa4cache[fa4]'" in line, line
    # --json: the same checks, for a fleet's health check to parse.
    rep = json.loads(js.stdout)
    assert rep["ok"] is False and rep["failed"] == 1
    row = next(c for c in rep["checks"] if c["check"] == "flash-attn-4")
    assert row == {
        "status": "FAIL",
        "check": "flash-attn-4",
        "detail": "not installed: pip install 'fa4cache[fa4]'",
    }
    assert len(rep["checks"]) == len(text.stdout.strip().splitlines())
    for c, ln in zip(rep["checks"], text.stdout.strip().splitlines()):
        assert ln.startswith(f"[{c['status']:^4}] {c['check']}") and ln.endswith(c["detail"]), (c, ln)


# ---------------------------------------------------------------- 17: logging, documented


def test_log_level_setting_reaches_the_library_and_the_cli(tmp_path: Path) -> None:
    import logging

    from fa4cache.cli import main
    from fa4cache.settings import BY_NAME

    assert "FA4CACHE_LOG_LEVEL" in BY_NAME
    code = (
        "import logging, fa4cache\n"
        "lg = logging.getLogger('fa4cache.store.example')\n"
        "lg.debug('DEBUG-LINE'); lg.info('INFO-LINE'); lg.warning('WARNING-LINE')\n"
        "print('OK')\n"
    )

    def lib(level: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "FA4CACHE_LOG_LEVEL"}
        if level is not None:
            env["FA4CACHE_LOG_LEVEL"] = level
        return subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
        )

    default, info, error, bad = lib(None), lib("info"), lib("ERROR"), lib("loud")
    assert all(p.stdout.strip() == "OK" for p in (default, info, error, bad))
    assert "WARNING-LINE" in default.stderr and "INFO-LINE" not in default.stderr
    assert "INFO-LINE" in info.stderr and "DEBUG-LINE" not in info.stderr
    assert error.stderr == ""
    assert "FA4CACHE_LOG_LEVEL" in bad.stderr and "WARNING-LINE" in bad.stderr  # one warning, nothing changed
    # The CLI: -v and -q, before or after the command, win over the setting.
    d = tmp_path / "c"
    root = logging.getLogger("fa4cache")
    saved = (root.level, root.propagate, list(root.handlers), logging.getLogger().level)
    try:
        for argv, env, want in (
            (["stats"], None, logging.WARNING),
            (["stats"], "debug", logging.DEBUG),
            (["-v", "stats"], "error", logging.INFO),
            (["stats", "-q"], "debug", logging.ERROR),
            (["ls", "--quiet"], None, logging.ERROR),
        ):
            os.environ.pop("FA4CACHE_LOG_LEVEL", None)
            if env:
                os.environ["FA4CACHE_LOG_LEVEL"] = env
            assert main(["--cache-dir", str(d), *argv]) == 0
            assert root.getEffectiveLevel() == want, (argv, env)
    finally:
        os.environ.pop("FA4CACHE_LOG_LEVEL", None)
        root.setLevel(saved[0])
        root.propagate = saved[1]
        root.handlers[:] = saved[2]
        logging.getLogger().setLevel(saved[3])
    p = run_cli(d, "stats", env={"FA4CACHE_LOG_LEVEL": "loud"})
    assert (
        p.returncode == 2 and "FA4CACHE_LOG_LEVEL" in p.stderr and "debug, info, warning, error" in p.stderr
    )
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    section = cli_doc.split("## Logging", 1)[1].split("\n## ", 1)[0]
    assert all(x in section for x in ("FA4CACHE_LOG_LEVEL", "-v", "-q", "stderr")), section


# ---------------------------------------------------------------- 16: ls --json says what ls says


def test_ls_json_mask_is_the_mask_ls_prints(tmp_path: Path) -> None:
    store = Store.at(tmp_path / "c")
    store.record_toolchain(TC, {"id": TC})
    specs = {
        1: {"mask": "document", "window": 256, "block_size": 16, "softcap": None, "varlen": False},
        2: {"mask": "document_window", "window": 128, "block_size": 16, "softcap": None, "varlen": True},
        3: None,  # compiled by a training call: the summary's hash prefix
    }
    for n, spec in specs.items():
        ref = EntryRef(TC, "fwd", f"{n}" * 64)  # digests that differ in the 12 characters ls shows
        summary = {"dtype": "bf16", "head_dim": 64, "mask": None if spec else "b2f70b3b0552"}
        assert store.publish_bytes(
            ref, b"\x7fELF" + bytes(100 + n), summary=summary, spec=spec, compile_seconds=1.0
        )
    text = run_cli(tmp_path / "c", "ls").stdout.splitlines()[1:-1]
    rows = json.loads(run_cli(tmp_path / "c", "ls", "--json").stdout)
    assert len(text) == len(rows) == 3
    shown = {line.split()[1]: line for line in text}
    for r in rows:
        line = shown[r["digest"][:12]]
        assert r["summary"]["mask"] and f" {r['summary']['mask']} " in line, (r["summary"], line)
    assert sorted(r["summary"]["mask"] for r in rows) == [
        "b2f70b3b0552",
        "document",
        "document_window(128) varlen",
    ]


# ---------------------------------------------------------------- 14: errors name the argument


def test_bad_paths_name_the_argument_and_how_base_dirs_splits() -> None:
    import fa4cache
    from fa4cache.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"^cache_dir: expected a directory path \(str or os.PathLike\), got int 123$"
    ):
        fa4cache.Settings.from_env(123)  # what install(123) hands on
    with pytest.raises(ConfigError, match="cache_dir: expected a directory path"):
        fa4cache.install(123)
    for call in (
        lambda: fa4cache.Settings.from_env("/tmp/x", base_dirs="/a:b"),
        lambda: fa4cache.env("/tmp/x", base_dirs="/a:b"),
    ):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith("base_dirs: base store must be an absolute path, got 'b'"), msg
        assert "split at ':'" in msg and "'/a' and 'b'" in msg and "cache directory" not in msg, msg


def test_mask_check_refuses_a_head_dim_fa4_does_not_run_and_a_meta_cu_seqlens() -> None:
    import torch

    import fa4cache

    mask = fa4cache.make_document_mask(torch.tensor([0, 212, 512]), seqlen=512)
    with pytest.raises(ValueError, match=r"head_dim: FA4 supports head dims 1 to 256, got 300"):
        mask.for_head_dim(300)
    with pytest.raises(
        ValueError, match=r"^q: head_dim \(q.shape\[3\]\): FA4 supports head dims 1 to 256, got 300$"
    ):
        mask.check(torch.zeros(1, 512, 2, 300))
    mask.check(torch.zeros(1, 512, 2, 256))  # the largest FA4 runs
    with pytest.raises(ValueError, match=r"^cu_seqlens: a tensor on the meta device holds no values"):
        fa4cache.make_document_mask(torch.tensor([0, 3, 8], device="meta"))


# ---------------------------------------------------------------- 8: the CLI reference is the parser's


def _flags_in_table(text: str) -> dict[str, set[str]]:
    """Per command a commands table's rows name (``| `fa4cache CMD ...` |``; a bundle row
    may name several: `` `fa4cache bundle export FILE [--current]` / `import FILE` ``), the
    flags they name."""
    import re

    out: dict[str, set[str]] = {}
    for cell in re.findall(r"^\| (`fa4cache [^|]*)\|", text, re.M):
        group = ""
        for part in cell.split(" / "):
            words = re.findall(r"[\w-]+", part.replace("fa4cache ", ""))
            if words[0] == "bundle":
                group, words = "bundle ", words[1:]
            flags = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", part))
            out.setdefault(group + words[0], set()).update(flags)
    return out


def test_the_cli_tables_name_only_flags_the_parser_has_and_shows() -> None:
    from fa4cache.cli import commands, options

    cmds = commands()
    for path in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        for cmd, flags in _flags_in_table(path.read_text()).items():
            if cmd not in cmds:  # `bundle export/import/show FILE`: the group's row
                continue
            shown = {f for a in options(cmds[cmd]) for f in a.option_strings}
            assert flags <= shown, (
                f"{path.name}: {cmd} documents {sorted(flags - shown)}, not shown by its parser"
            )
    readme = _flags_in_table((ROOT / "README.md").read_text())
    assert "--rebuild" in readme["verify"]
    assert "--verify" in (ROOT / "README.md").read_text().split("fa4cache bundle", 1)[1].split("\n", 1)[0]


def test_the_cli_reference_is_generated_from_the_parser() -> None:
    import importlib.util

    from fa4cache.cli import commands, markdown_reference, options

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.cli_page((ROOT / "docs" / "cli.md").read_text())
    assert markdown_reference() in page
    for name, p in commands().items():
        assert f"### fa4cache {name}\n" in page, name
        section = page.split(f"### fa4cache {name}\n", 1)[1].split("\n### ", 1)[0]
        for a in options(p, common=False):
            assert f"`{', '.join(a.option_strings) or a.metavar or a.dest}" in section, (name, a.dest)
    assert "--all" not in page.split("### fa4cache bundle export\n", 1)[1].split("\n### ", 1)[0]  # hidden
    with pytest.raises(ValueError, match="lost its marker"):
        hooks.cli_page("# CLI\n")


# ---------------------------------------------------------------- 6: warm --generation reads as warm


_MISS = """
import sys
from fa4cache.store import Store, counters, nearmiss
from tests.helpers.fake_compiler import FakeFA4

store = Store(cache_dir=sys.argv[1])
fa = FakeFA4(store, "fwd")
fa.call(7, 0)
nearmiss._seen_kinds.clear()  # as in a fresh process: its first miss of the kind
if sys.argv[2] == "warm":
    counters.mark_warm_process()
fa.call(8, 0)
print("compiles", fa.compiles)
"""


@pytest.mark.parametrize("who", ["job", "warm"])
def test_a_miss_is_news_in_a_job_and_not_in_warm(tmp_path: Path, who: str) -> None:
    p = subprocess.run(
        [sys.executable, "-c", _MISS, str(tmp_path / who), who],
        cwd=ROOT, env=worker_env(tmp_path / who), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == "compiles 2", p.stdout + p.stderr
    said = "fwd miss: the closest key in this store differs in key" in p.stderr
    assert said == (who == "job"), p.stderr


def test_ls_names_generation_kernels(tmp_path: Path) -> None:
    store = Store.at(tmp_path / "c")
    store.record_toolchain(TC, {"id": TC})
    gen = {"heads": 4, "heads_kv": 2, "head_dim": 64, "softcap": None, "dtype": "bf16"}
    for n, window in ((1, None), (2, None), (3, 512)):
        spec = {"generation": {**gen, "window": window}, "arch": "sm_90"}
        ref = EntryRef(TC, "fwd", f"{n}" * 64)
        assert store.publish_bytes(
            ref, b"\x7fELF" + bytes(100 + n), summary={"dtype": "bf16", "head_dim": 64}, spec=spec
        )
    lines = run_cli(tmp_path / "c", "ls").stdout.splitlines()[1:-1]
    masks = sorted(line.split()[4] for line in lines)
    assert masks == ["generation", "generation", "generation(512)"], lines
    rows = json.loads(run_cli(tmp_path / "c", "ls", "--json").stdout)
    assert sorted(r["summary"]["mask"] for r in rows) == masks


# ---------------------------------------------------------------- 18: --json where a script reads


def test_prune_and_clear_json_say_what_the_run_removes(four_kernels: Path, tmp_path: Path) -> None:
    dry = run_cli(four_kernels, "prune", "--older-than", "1d", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True and len(plan["removed"]) == 3 and plan["remaining"] == 1
    assert _objects(four_kernels) == {f"{n:064x}" for n in (1, 2, 3, 4)}
    real = json.loads(run_cli(four_kernels, "prune", "--older-than", "1d", "--yes", "--json").stdout)
    assert real["dry_run"] is False and real["skipped"] == real["failed"] == []
    assert sorted(r["digest"] for r in real["removed"]) == sorted(r["digest"] for r in plan["removed"])
    assert real["removed_bytes"] == plan["removed_bytes"] and real["remaining"] == 1
    c = json.loads(run_cli(four_kernels, "clear", "--dry-run", "--json").stdout)
    assert [r["kind"] for r in c["removed"]] == ["bwd_postprocess_convert"] and c["remaining"] == 0
    gone = run_cli(tmp_path / "none", "prune", "--max-size", "1G", "--json")
    assert gone.returncode == 0 and json.loads(gone.stdout)["removed"] == []


# ---------------------------------------------------------------- 4: a Ray job's store path, checked in env()


@pytest.mark.parametrize("written", ["{node_id}", "fa4cache-{user}", "{hostname}/store"])
def test_env_refuses_a_per_node_path_under_a_file_as_install_does(tmp_path: Path, written: str) -> None:
    import fa4cache
    from fa4cache.errors import ConfigError

    afile = tmp_path / "afile"
    afile.write_text("")
    raw = f"{afile}/{written}"
    # install() in a plain process: the path resolved here is under a file.
    with pytest.raises(ConfigError, match=f"cache_dir=.* is under {afile}, which is a file"):
        fa4cache.install(raw)
    # env(): the same check, in the driver, naming the workers' FA4CACHE_DIR and the fix.
    with pytest.raises(ConfigError) as e:
        fa4cache.env(raw)
    msg = str(e.value)
    assert f"is under {afile}, which is a file" in msg and f"FA4CACHE_DIR={raw}" in msg, msg
    assert "point cache_dir at a directory you own" in msg, msg
    # A per-node path that nothing blocks is still accepted, placeholders kept for the workers.
    ok = str(tmp_path / f"ok/{written}")
    assert fa4cache.env(ok)["env_vars"]["FA4CACHE_DIR"] == ok


# ---------------------------------------------------------------- 19: an unusable store at install()

_INSTALL = """
import json, logging
messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
logging.getLogger().addHandler(Keep())
from fa4cache.adapters.install import install, uninstall
from fa4cache.errors import ConfigError
from tests.helpers.fake_compiler import FakeFA4
out = {}
for case, path in CASES.items():
    messages.clear()
    try:
        store = install(path, compile_server=False)
    except ConfigError as e:
        out[case] = {"raised": str(e), "warnings": list(messages)}
        continue
    at_install = list(messages)
    fa = FakeFA4(store)
    fa.call(1, 0)  # stored by _seed where there is a store
    fa.call(2, 0)  # stored nowhere
    out[case] = {"writable": store.writable, "compiles": fa.compiles, "at_install": at_install,
                 "warnings": list(messages)}
    uninstall()
print("RESULT", json.dumps(out))
"""


def test_an_unusable_store_at_install_is_an_error_or_one_warning_and_kernels_still_run(
    people: Any,  # noqa: F811
) -> None:
    """docs/store.md, "An unusable store directory": a path that can never be a directory is
    bad input (ConfigError naming the setting and the fix); a store that cannot be written
    (its parent cannot be created, it is read-only) is one warning at install naming the cause
    and the fix, the kernels already there still load, new ones run from memory."""
    from tests.store.test_other_users import PRELOAD, User

    victim, _, _ = people
    victim = User(victim.name, victim.home, (*PRELOAD, "fa4cache.adapters.install"))
    base = victim.home / "unusable"
    victim.run(f"import os; os.makedirs({str(base)!r}, exist_ok=True)")
    (base / "afile").write_text("")
    os.chown(base / "afile", victim.uid, victim.gid)
    locked = base / "locked"  # a parent the store cannot be created in
    read_only = base / "read-only"  # a store with kernel 1 in it, then made read-only
    _seed(victim, read_only)
    victim.run(
        f"import os\nos.makedirs({str(locked)!r}, mode=0o500)\n"
        f"for top, dirs, _ in os.walk({str(read_only)!r}):\n"
        f"    for d in dirs: os.chmod(os.path.join(top, d), 0o500)\n"
        f"os.chmod({str(read_only)!r}, 0o500)"
    )
    cases = {"file": str(base / "afile"), "parent": str(locked / "store"), "read-only": str(read_only)}
    r = json.loads(victim.run(f"CASES = {cases!r}\n" + _INSTALL).stdout.split("RESULT ", 1)[1])
    print(json.dumps(r, indent=1))
    # Bad input: raised, naming the argument and the fix; nothing warned.
    assert "cache_dir=" in r["file"]["raised"] and "is a file, not a directory" in r["file"]["raised"]
    assert "point cache_dir at a directory you own" in r["file"]["raised"] and not r["file"]["warnings"]
    for case, held in (("read-only", 1), ("parent", 0)):
        c = r[case]
        assert c["writable"] is False, (case, c)
        # One warning, at install, naming the directory, the cause and the fix; none per call.
        assert len(c["at_install"]) == 1 and c["warnings"] == c["at_install"], (case, c)
        (w,) = c["warnings"]
        assert f"cannot write to cache_dir={cases[case]}" in w and "not writable by you" in w, (case, w)
        assert "kernels will not be persisted" in w and "point cache_dir at" in w, (case, w)
        assert "FA4CACHE_BASE_DIRS" in w, (case, w)
        # The kernels already stored still load; the others run from memory.
        assert c["compiles"] == 2 - held, (case, c)
    assert "the kernels already there still load" in r["read-only"]["warnings"][0]


# ---------------------------------------------------------------- 3: what a command says about the host

_JOB_TOOLCHAIN = """
import sys
from fa4cache.adapters.patch import expected_patches
from fa4cache.adapters.route import job_toolchain
from fa4cache.store.store import Store
from tests.helpers import fake_compiler
fake_compiler.TOOLCHAIN = job_toolchain(expected_patches())  # a kernel stored for this toolchain
fake_compiler.FakeFA4(Store.at(sys.argv[1])).call(1, 0)
print(fake_compiler.TOOLCHAIN.id)
"""


def test_bundle_show_and_import_see_the_gpu_doctor_sees(tmp_path: Path) -> None:
    """On a GPU host with no arch named, ``bundle show``/``import`` said "this machine has no
    target arch (no GPU, ...)" where ``doctor`` found the GPU: they asked torch only if it was
    imported already. The GPU is faked below torch.cuda's device queries
    (tests/helpers/fake_gpu.py): everything fa4cache does to find it is real."""
    clean = {k: v for k, v in os.environ.items() if k not in ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH")}
    clean = {k: v for k, v in clean.items() if k != "FLASH_ATTENTION_NUM_SMS"} | {"PYTHONPATH": str(ROOT)}
    # A kernel for the toolchain jobs on an H200 compile for, the arch named instead of seen.
    src, dst, bundle = tmp_path / "src", tmp_path / "dst", tmp_path / "k.fa4b"
    named = subprocess.run(
        [sys.executable, "-c", _JOB_TOOLCHAIN, str(src)], cwd=ROOT, env={**clean, "FLASH_ATTENTION_ARCH": "sm_90"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    tc = named.stdout.strip()
    assert run_cli(src, "bundle", "export", str(bundle)).returncode == 0

    def on_h200(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tests.helpers.fake_gpu", "--cache-dir", str(dst), *args],
            cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    doc = on_h200("doctor", "--json")
    checks = {c["check"]: c["detail"] for c in json.loads(doc.stdout)["checks"]}
    assert checks["GPU"].startswith("NVIDIA H200 (sm_90)"), checks
    assert checks["target"] == "sm_90, 132 SMs (from the GPU)", checks
    for command in (("bundle", "show", str(bundle)), ("bundle", "import", str(bundle))):
        p = on_h200(*command)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "no target arch" not in p.stdout + p.stderr, (command, p.stdout)
        assert f"1 kernel(s) of toolchain {tc} can serve this host" in p.stdout, (command, p.stdout)
    # Without the fake GPU this machine has none, and the same command says so.
    cpu = subprocess.run(
        [sys.executable, "-m", "fa4cache", "--cache-dir", str(dst), "bundle", "show", str(bundle)],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "this machine has no target arch" in cpu.stdout, cpu.stdout + cpu.stderr


def test_doctor_fails_a_setting_install_would_refuse(tmp_path: Path) -> None:
    # A newcomer's walk: FA4CACHE_VERIFY_HITS=2 made install() raise, while doctor said every
    # check was ok (exit 0).
    from tests.conftest import run_cli

    for var, value in (("FA4CACHE_VERIFY_HITS", "2"), ("FA4CACHE_COMPILE_AHEAD", "maybe")):
        p = run_cli(tmp_path / "store", "doctor", env={var: value})
        assert p.returncode == 1, p.stdout + p.stderr
        assert any(ln.startswith("[FAIL] setting") and var in ln for ln in p.stdout.splitlines()), p.stdout
    ok = run_cli(tmp_path / "store", "doctor", "--json")
    assert '"check": "settings"' in ok.stdout, ok.stdout
