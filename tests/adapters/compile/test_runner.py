"""The one warm runner (fa4cache.adapters.compile.runner, ``fa4cache.warm``), with real FA4
cross-compiles in fresh processes, and its split's claiming order (fa4cache.adapters.compile.split)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fa4cache.adapters.compile.split import order

from fa4cache.store.paths import Layout
from tests.conftest import ROOT, worker_env

TARGET_VARS = ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS", "QUACK_ARCH")

_RUN = """
import json, os, sys
import fa4cache
from fa4cache.adapters.compile.runner import WarmReport

vars = {TARGET_VARS!r}
spec = fa4cache.KernelSpec(mask="causal", head_dim=64, seqlen=256, backward=False)
out = []
for how in sys.argv[2:]:
    kw = {{"jobs": 2}} if how == "jobs" else {{"split": (0, 1)}} if how == "split" else {{}}
    report = fa4cache.warm([spec], sys.argv[1], **kw)
    assert isinstance(report, WarmReport)
    out.append({{"rows": [[r.label, r.compiled, r.present, r.error, r.kernels] for r in report.rows],
                "env": {{k: os.environ.get(k) for k in vars}}, "target": report.target.arch}})
print("RESULT " + json.dumps(out))
"""


def _run(cache: Path, *hows: str) -> list[dict[str, object]]:
    env = {k: v for k, v in worker_env(cache).items() if k not in TARGET_VARS}
    p = subprocess.run(
        [sys.executable, "-c", _RUN.format(TARGET_VARS=TARGET_VARS), str(cache), *hows],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.compile
def test_one_runner_serial_then_split_then_parallel_one_row_each_and_no_environment_left(
    tmp_path: Path,
) -> None:
    """No target variable set: the plan's target is used for the run only. The first run
    compiles the forward (and only it), every later mode finds it present; a second run in
    the same process finds it in memory."""
    cache = tmp_path / "cache"
    (first,) = _run(cache, "serial")
    split, jobs = _run(cache, "split") + _run(cache, "jobs")  # each in a fresh process, as a job would
    label = "bf16 d64 h16:16 causal"
    assert first["rows"] == [[label, 1, 0, None, 1]], first
    (again,) = _run(tmp_path / "other", "serial", "split")[1:]
    assert again["rows"] == [[label, 0, 1, None, 1]], again
    assert split["rows"] == [[label, 0, 1, None, 1]], split
    assert jobs["rows"] == [[label, 0, 1, None, 1]], jobs
    for run in (first, split, jobs):
        assert run["target"] == "sm_90" and run["env"] == {k: None for k in TARGET_VARS}, run
    assert sorted(e.ref.kind for e in Layout(cache).iter_entries()) == ["fwd"]


def test_each_rank_starts_claiming_at_its_own_share() -> None:
    kernels = list(range(8))
    assert order(kernels, 0, 4) == kernels
    assert order(kernels, 1, 4) == [2, 3, 4, 5, 6, 7, 0, 1]
    assert order(kernels, 3, 4)[:2] == [6, 7] and sorted(order(kernels, 3, 4)) == kernels
    assert order([], 1, 2) == []


def test_a_kernel_compiled_but_not_saved_is_a_failed_item() -> None:
    """warm -j 1 counts what the store did: a publish error (a full disk) fails the spec."""
    from types import SimpleNamespace

    from fa4cache.adapters.compile.warm_specs import counted

    values = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "compile_seconds": 0.0, "publish_errors": 0}
    store = SimpleNamespace(
        counters=SimpleNamespace(counts=lambda: dict(values))
    )  # what warm reads of a Store

    def run() -> None:
        values["compiles"] += 1
        values["publish_errors"] += 1

    r = counted(store, lambda: None, "spec", run)
    assert r["compiles"] == 1 and r["error"] is not None and "not saved" in r["error"]
