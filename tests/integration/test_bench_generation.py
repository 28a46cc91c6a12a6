"""benchmarks/bench_generation.py on the CPU: its code paths (generate and generate_batch
runs, an implementation that fails, the budget, the table) with a tiny model and FA4's
stand-in, so that the GPU run meets no Python error of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    from fa4cache.ops import kv_cache, varlen_calls
    from tests.helpers import fa4_varlen_model

    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("FA4CACHE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(
        kv_cache, "_fa4_forward", lambda *a, **kw: fa4_varlen_model.flash_attn_fwd(*a, **kw)[0]
    )
    monkeypatch.setattr(varlen_calls, "forward", fa4_varlen_model.forward)
    monkeypatch.setattr(varlen_calls, "backward", fa4_varlen_model.backward)
    import bench_generation

    return bench_generation


TINY = ["--device", "cpu", "--shape", "tiny", "--layers", "1", "--prompt-len", "4", "9", "--name", "gen"]


def test_every_run_is_a_row_and_a_failing_implementation_does_not_stop_the_others(
    bench: Any, tmp_path: Any
) -> None:
    # flash_attention_4 cannot load on the CPU: its rows say why, every other run measures.
    # (generate_batch's sdpa run is left out: on the CPU it takes seconds per call.)
    argv = [*TINY, "--prompts", "2", "3", "--new", "6", "--budget", "300", "--batch-impls", "fa4cache"]
    data = bench.main(argv)
    runs = {(r["api"], r["impl"], r["prompts"]): r for r in data["runs"]}
    assert len(runs) == len(data["runs"]) == 8
    for (api, impl, n), r in runs.items():
        if impl == "flash_attention_4":
            assert r["error"] and "skipped" not in r["error"], r
            continue
        assert "error" not in r, r
        assert r["new"] == 6 and r["decode_tokens_per_s"] > 0 and r["compiles"] >= 0, r
        if api == "generate_batch":
            assert r["requests_done"] == n, r
    saved = json.loads((tmp_path / "results" / "gen.json").read_text())
    assert saved["runs"] == json.loads(json.dumps(data["runs"], default=str))
    md = (tmp_path / "results" / "gen.md").read_text()
    assert "1 of 36 layers" in md and "| generate_batch | 3 " in md and "| 1.00x" in md  # sdpa over itself
    assert data["fa4cache_compiles_in_timed_runs"] is not None


def test_past_the_budget_runs_are_skipped_and_the_table_is_still_written(bench: Any, tmp_path: Any) -> None:
    data = bench.main([*TINY, "--prompts", "2", "--new", "4", "--budget", "1", "--batch-impls"])
    assert [r["error"] for r in data["runs"]] == ["skipped: past --budget 1 s"] * 3
    md = (tmp_path / "results" / "gen.md").read_text()
    assert md.count("skipped: past --budget") == 3 and "no fa4cache run finished" in md
