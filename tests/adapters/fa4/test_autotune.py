"""FA4's autotuner under fa4cache (adapters/fa4/autotune.py): candidates compile into the store,
winners are kept there. Real processes and real cross-compiles (tests/helpers/autotune_worker.py
says which GPU-only answers stand in); run against an FA4 that has ``flash_attn.cute.autotune``
(4.0.0b40: ``PYTHONPATH=/path/to/fa4-b40 pytest tests/adapters/fa4/test_autotune.py``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_results, worker_env


def _autotuner_here() -> str | None:
    """Why these tests cannot run here, or None."""
    spec = importlib.util.find_spec("flash_attn")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not any(os.path.exists(os.path.join(r, "cute", "autotune.py")) for r in roots):
        return "the installed FA4 has no flash_attn.cute.autotune (4.0.0b40 has)"
    from fa4cache import fa4_releases

    why = fa4_releases.why_off(fa4_releases.Coupling.AUTOTUNE)
    return f"the autotune coupling is off: {why}" if why else None


_why = _autotuner_here()
needs_autotuner = pytest.mark.skipif(_why is not None, reason=_why or "")
DEFAULT_AND_VARIANT = [
    "default",
    "tile_n64",
]  # the variant has the smaller tile_n: the stand-in timing picks it


def _worker(store: Path, *args: str) -> list[dict[str, Any]]:
    return run_results("tests.helpers.autotune_worker", store, *args, FA4CACHE_COMPILE_AHEAD="0")


def _tune(store: Path, *steps: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Steps: (seqlen, candidates) or (seqlen, candidates, the fa4cache stage made to raise)."""
    keys = ("seqlen", "candidates", "fault")
    return _worker(store, "tune", json.dumps([dict(zip(keys, step)) for step in steps]))


@needs_autotuner
@pytest.mark.compile
def test_a_candidate_compiles_in_a_child_into_the_store_and_the_probe_then_finds_it(tmp_path: Path) -> None:
    (row,) = _worker(tmp_path / "store", "compile_one")
    assert row["patched"], "FA4's _compile_one was not replaced"
    assert row["missed_before"] == 1  # the candidate's forward kernel was not there
    assert row["published"] == 1, row["stderr"][-3000:]  # the child published it
    # FA4's own miss probe in the parent now finds it in the store, loads it (no compile
    # here) and leaves no lock held.
    assert row["missed_after"] == 0
    assert row["disk_hits"] == 1 and row["compiles"] == 0
    assert row["pending_locks"] == 0


@needs_autotuner
@pytest.mark.compile
def test_the_winner_is_kept_in_the_store_for_the_next_process(tmp_path: Path) -> None:
    from fa4cache.store.store import Store

    store = tmp_path / "store"
    key = (256, DEFAULT_AND_VARIANT)

    # Process 1 tunes: both candidates compile in children (none in this process) and the
    # winner is stored.
    (first,) = _tune(store, key)
    assert (first["measure_calls"], first["barrier_calls"], first["compile_one_calls"]) == (1, 1, 2)
    assert first["index"] == 1 and first["winner"]["tile_n"] == 64
    assert first["compiles"] == 0 and first["pending_locks"] == 0
    assert len(list(Store.at(store).entries(kind="autotune"))) == 1

    # Process 2: the same call gets the same winner with no tuning and no compile; another
    # shape, or another candidate list, is a miss and tunes.
    same, other_shape, other_list = _tune(store, key, (512, DEFAULT_AND_VARIANT), (256, ["tile_n64"]))
    assert same["winner"] == first["winner"] and same["index"] == 1
    assert (same["measure_calls"], same["barrier_calls"], same["compile_one_calls"]) == (0, 0, 0)
    assert same["compiles"] == 0 and same["autotune_hits"] == 1
    assert other_shape["measure_calls"] == 1 and other_shape["autotune_hits"] == 0
    assert other_list["measure_calls"] == 1 and other_list["index"] == 0
    assert 0 == same["pending_locks"] == other_shape["pending_locks"] == other_list["pending_locks"]
    print(
        f"tune_fwd_config: process 1 {first['seconds']:.2f} s, process 2 (stored winner) {same['seconds']:.4f} s"
    )

    # A stored index out of range is no winner: tuning runs again and stores a good one.
    s = Store.at(store)
    for e in list(s.entries(kind="autotune")):
        art = s.load(e.ref)
        assert art is not None
        entry = json.loads(art.data)
        entry["index"] = entry["candidates"] + 3
        assert s.publish_bytes(e.ref, json.dumps(entry).encode(), **art.sidecar.facts())
    # Trouble inside fa4cache fails open to FA4's tuning, one warning naming the stage.
    other = (384, DEFAULT_AND_VARIANT)
    again, then, no_key, no_lock, locked_publish, no_write, unstored = _tune(
        store, key, key, (*other, "key encoding"), (*other, "lock"), other, (448, DEFAULT_AND_VARIANT, "store write"),
        (448, DEFAULT_AND_VARIANT),
    )  # fmt: skip
    assert again["measure_calls"] == 1 and again["autotune_hits"] == 0 and again["winner"] == first["winner"]
    assert [w for w in again["warnings"] if "holds no winner" in w] != []
    assert then["measure_calls"] == 0 and then["autotune_hits"] == 1 and then["winner"] == first["winner"]
    for row, stage in ((no_key, "key encoding"), (no_lock, "lock"), (no_write, "store write")):
        assert row["measure_calls"] == 1 and row["winner"] == first["winner"], row
        named = [w for w in row["warnings"] if f"{stage} failed for an autotuning winner" in w]
        assert len(named) == 1 and "Fix:" in named[0], row["warnings"]
        assert row["pending_locks"] == 0
    assert no_lock["entries"] == no_key["entries"] + 1  # stored without the lock
    assert locked_publish["measure_calls"] == 0 and locked_publish["autotune_hits"] == 1
    assert no_write["entries"] == locked_publish["entries"]  # nothing half-written
    assert unstored["measure_calls"] == 1


@needs_autotuner
@pytest.mark.compile
def test_two_processes_tuning_the_same_call_tune_once(tmp_path: Path) -> None:
    store, go = tmp_path / "store", tmp_path / "go"
    step = json.dumps([{"seqlen": 256, "candidates": DEFAULT_AND_VARIANT, "wait": str(go), "hold": 5.0}])
    env = dict(worker_env(store), FA4CACHE_COMPILE_AHEAD="0")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.autotune_worker", "tune", step],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    go.touch()
    rows = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-5000:]
        rows += [json.loads(ln[len("RESULT ") :]) for ln in out.splitlines() if ln.startswith("RESULT ")]
    # One tuned (its timing took 5 s, under the key's lock); the other waited and loaded its winner.
    assert sorted(r["measure_calls"] for r in rows) == [0, 1], rows
    assert sorted(r["autotune_hits"] for r in rows) == [0, 1], rows
    assert rows[0]["winner"] == rows[1]["winner"]
    assert 0 == rows[0]["compiles"] == rows[1]["compiles"]


@needs_autotuner
def test_the_autotuner_is_routed_only_while_installed_and_only_where_the_coupling_is_on(
    tmp_path: Path,
) -> None:
    (row,) = _worker(tmp_path / "store", "coupling")
    assert row["installed"] == {"_compile_one": True, "tune_fwd_config": True, "CUTE_DSL_CACHE_ENABLED": True}
    fa4s_own = {"_compile_one": False, "tune_fwd_config": False, "CUTE_DSL_CACHE_ENABLED": False}
    assert row["uninstalled"] == fa4s_own
    assert row["coupling_off"] == fa4s_own


def test_a_stored_winner_is_read_only_when_it_is_one_of_the_candidates() -> None:
    from fa4cache.adapters.fa4.autotune import FORMAT, winner_index

    def entry(**kw: Any) -> bytes:
        return json.dumps({"format": FORMAT, "index": 1, "candidates": 3, **kw}).encode()

    assert winner_index(entry(), 3) == 1
    assert winner_index(entry(index=0), 3) == 0
    for bad in (entry(index=3), entry(index=-1), entry(index=True), entry(index="1"), entry(index=1.0)):
        assert winner_index(bad, 3) is None
    assert winner_index(entry(), 2) is None  # stored for another number of candidates
    assert winner_index(entry(format=FORMAT + 1), 3) is None
    assert winner_index(b"\xff not json", 3) is None
    assert winner_index(b"[1]", 3) is None
