"""warm(plan, background=True): a handle whose report fills in as the compile server's workers finish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fa4cache.store.paths import Layout
from tests.adapters.compile.test_runner import TARGET_VARS
from tests.conftest import ROOT, worker_env

_BACKGROUND = """
import json, os, sys
import fa4cache
from fa4cache.adapters.compile import server as compile_server

spec = fa4cache.KernelSpec(mask="causal", head_dim=64, seqlen=256, backward=False)
run = fa4cache.warm([spec], sys.argv[1], background=True)  # returns at once
report = run.wait(timeout=540)
with compile_server._live_lock:
    servers = len(compile_server._live)
print("RESULT " + json.dumps({
    "started": run.started, "skipped": run.skipped, "done": run.done, "error": report.error,
    "rows": [[r.label, r.compiled, r.present, r.error, r.kernels] for r in report.rows],
    "servers": servers, "fa4_here": "flash_attn.cute.interface" in sys.modules,
    "env": {k: os.environ.get(k) for k in sys.argv[2:]},
}))
"""


@pytest.mark.compile
def test_background_is_an_option_of_the_runner_whose_report_fills_in(tmp_path: Path) -> None:
    """``warm(plan, background=True)`` returns a handle at once; the compile server's children
    compile the plan's kernels (FA4 is never imported here) and the handle's report gets one
    row per item. Run again on the stored set, it starts no server and reports it present."""
    cache = tmp_path / "cache"
    env = {k: v for k, v in worker_env(cache).items() if k not in TARGET_VARS}
    out = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-c", _BACKGROUND, str(cache), *TARGET_VARS],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, p.stderr[-4000:]
        out.append(json.loads(lines[-1][len("RESULT ") :]))
    first, again = out
    label = "bf16 d64 h16:16 causal"
    assert first["started"] and first["done"] and first["error"] is None, first
    assert first["rows"] == [[label, 1, 0, None, 1]], first
    assert first["servers"] == 1 and not first["fa4_here"], first
    assert first["env"] == {k: None for k in TARGET_VARS}, first  # the target went to the server only
    assert not again["started"] and again["skipped"] == "stored" and again["servers"] == 0, again
    assert again["rows"] == [[label, 0, 1, None, 1]], again
    assert sorted(e.ref.kind for e in Layout(cache).iter_entries()) == ["fwd"]


def test_a_background_run_fills_its_report_in_as_its_workers_report() -> None:
    """A background run's report has no rows until a worker reports, then one per spec (a
    kernel counted compiled by whichever worker compiled it); it is done when every worker
    has reported, or when its server exits first (the report then says so)."""
    from fa4cache.adapters.compile.background import Warming

    from fa4cache.aot.plan import WarmPlan
    from fa4cache.aot.spec import KernelSpec

    a, b = KernelSpec(head_dim=64), KernelSpec(head_dim=128, backward=True)
    run = Warming(WarmPlan((a, b)), "/c", workers=2)
    assert run.started and not run.done and run.report().rows == ()
    planned = [["f1"], ["f2", "p", "b", "q1", "q2"]]
    run._take({"jobs": planned, "compiled": {"f1": 1.0, "b": 4.0}, "errors": {}, "task": "t"})
    assert not run.done
    assert [(r.compiled, r.present, r.kernels) for r in run.report().rows] == [(1, 0, 1), (1, 4, 5)]
    run._take({"jobs": planned, "compiled": {"f2": 2.0, "p": 0.5}, "errors": {"1": "E: x"}, "task": "t"})
    report = run.wait(timeout=5)
    assert run.done and report.error is None
    assert [(r.compiled, r.present, r.error) for r in report.rows] == [(1, 0, None), (3, 2, "E: x")]
    assert report.rows[1].compile_seconds == 6.5
    cut = Warming(WarmPlan((a,)), "/c", workers=2)
    cut._take({"jobs": [["f1"]], "compiled": {"f1": 1.0}, "errors": {}})
    cut._take({"error": "the compile server exited", "jobs": [], "ended": True})
    assert cut.done and cut.wait(timeout=5).error == "the compile server exited"
    assert Warming(WarmPlan((a,)), "/c", skipped="stored").done
