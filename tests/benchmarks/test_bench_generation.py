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
    from fa4cache.decode import launch
    from fa4cache.ops import varlen_calls
    from tests.helpers import fa4_varlen_model

    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("FA4CACHE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(launch, "_fa4_forward", lambda *a, **kw: fa4_varlen_model.flash_attn_fwd(*a, **kw)[0])
    monkeypatch.setattr(varlen_calls, "forward", fa4_varlen_model.forward)
    monkeypatch.setattr(varlen_calls, "backward", fa4_varlen_model.backward)
    import bench_generation

    return bench_generation


TINY = ["--device", "cpu", "--shape", "tiny", "--name", "gen", "--no-grid", "--warm", "2", "--repeats", "3"]


def test_every_job_is_a_row_warmed_timed_alike_and_a_failing_implementation_does_not_stop_the_others(
    bench: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # flash_attention_4 cannot load on the CPU: its entry says why, the others measure.
    # Every implementation: 2 untimed then 3 timed runs of exactly --new tokens, alternating.
    calls: list[tuple[str, int]] = []
    real = bench.run_once

    def spy(path: str, model: Any, ids: Any, mask: Any, new: int) -> Any:
        secs, tokens = real(path, model, ids, mask, new)
        calls.append((model.config._attn_implementation, tokens))
        return secs, tokens

    monkeypatch.setattr(bench, "run_once", spy)
    argv = [
        *TINY,
        "--new",
        "5",
        "--budget",
        "600",
        "--profile-new",
        "4",
        "--jobs",
        "generate:x:2:12",
        "generate:x:3:8",
    ]
    data = bench.main(argv)
    assert [(r["path"], r["batch"], r["prompt"]) for r in data["rows"]] == [
        ("generate", 2, 12),
        ("generate", 3, 8),
    ]
    for r in data["rows"]:
        assert "error" not in r, r
        assert r["impls"]["flash_attention_4"]["error"], r
        for impl in ("fa4cache", "sdpa"):
            e = r["impls"][impl]
            assert e["runs"] == 3 and e["tokens"] == r["batch"] * 5 and e["tokens_per_s"] > 0, e
        assert r["fa4_compiles_timed"] >= 0
        assert len(r["round_ratios"]) == 3 and all(x > 0 for x in r["round_ratios"]), r
    # Per job: warm-ups (fa4cache, sdpa: 2 each), then timed ABAB order reversed every round.
    first = [impl for impl, _ in calls[:7]]
    assert first == ["fa4cache", "fa4cache", "sdpa", "sdpa", "fa4cache", "sdpa", "sdpa"], first
    assert {t for _, t in calls[:7]} == {10}
    err = data["logits"]["tiny"]
    assert err["fa4cache"] <= 4 * err["sdpa"] + 0.05, err  # bf16: within sdpa's own noise
    for impl in ("fa4cache", "sdpa"):  # the per-step profile, from inside generate
        prof = data["profile"][f"tiny:{impl}:2:12"]
        assert prof["attention_host_us_per_layer"] > 0 and prof["ms_per_step_timed"] > 0, prof
        assert prof["wall_ms_per_step"] > 0 and prof["syncs_per_step"] >= 0, prof
    saved = json.loads((tmp_path / "results" / "gen.json").read_text())
    assert len(saved["rows"]) == 2
    md = (tmp_path / "results" / "gen.md").read_text()
    assert "| generate | tiny  | 2 | 12     | 5   |" in md and "attention host µs/layer" in md


def test_generate_batch_and_the_static_path_run_and_the_budget_cuts_the_rest(
    bench: Any, tmp_path: Any
) -> None:
    # generate_batch (sdpa left out: seconds per call on the CPU); the static path with
    # transformers' compile is not run on the CPU (inductor), only its rows' budget skip.
    argv = [*TINY, "--new", "4", "--budget", "600", "--impls", "fa4cache", "--warm", "1", "--repeats", "1",
            "--jobs", "generate_batch:x:2:6"]  # fmt: skip
    data = bench.main(argv)
    (r,) = data["rows"]
    assert r["impls"]["fa4cache"]["tokens"] == 8, r
    data = bench.main([*TINY, "--budget", "0", "--jobs", "static_compiled:x:2:6", "generate:x:1:4"])
    assert [r["error"] for r in data["rows"]] == ["skipped: past --budget 0 s"] * 2
    md = (tmp_path / "results" / "gen.md").read_text()
    assert md.count("skipped: past --budget") == 2 and "no run finished" in md


def test_the_job_list_puts_the_priorities_first_then_the_grid(bench: Any) -> None:
    jobs = bench.all_jobs(bench.PRIORITY, ["llama-d64", "qwen3-4b"])
    assert jobs[: len(bench.PRIORITY)] == [bench.parse_job(s) for s in bench.PRIORITY]
    assert len(jobs) == len(set(jobs)) == len(bench.PATHS) * 2 * 4 * 2 + 1  # + llama-d128, off the shapes
    assert ("generate", "qwen3-4b", 64, 128) in jobs


def test_a_timed_run_has_the_collector_off_and_the_ratio_is_paired_by_round(bench: Any) -> None:
    import gc

    secs, during = bench.timed(gc.isenabled)
    assert during is False and gc.isenabled() and secs >= 0
    # Round 2's host was twice as slow for both: the paired ratio stays 2, a ratio of
    # per-implementation medians would not.
    results = {"fa4cache": {"times": [1.0, 2.0, 1.0]}, "sdpa": {"times": [2.0, 4.0, 2.5]}}
    assert bench.round_ratios(results) == [2.0, 2.0, 2.5]
    assert bench._ratio({"round_ratios": [2.0, 2.0, 2.5]}, None, None) == "2.00x (2.00-2.50)"
    assert bench.round_ratios({"fa4cache": {"times": [1.0]}}) == []
