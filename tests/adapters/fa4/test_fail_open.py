"""Fail open: each stage of fa4cache made to raise in turn, with real FA4 cross-compiles.

The FA4 call returns what plain FA4 returns, one warning names the stage, no lock stays held
and nothing half-written stays in the store. CI runs this file against every FA4 release in
the supported range (.ci/run); the table is printed at the end of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_results

pytestmark = [pytest.mark.compile, pytest.mark.xdist_group("fail_open")]

# Stages injected in one process, each with its own kernel; the remote tier and the patch
# change how the store is built or how FA4 is imported, so each gets a process of its own.
SHARED = ["none", "key encoding", "code identity", "store read", "store write", "lock", "compile server"]
ALONE = ["remote tier", "patch"]


def _run(stages: list[str], store: Path) -> dict[str, dict[str, Any]]:
    # No background compiles of backward kernels: each stage's one forward is what is judged.
    rows = run_results("tests.helpers.fail_open_worker", store, *stages, FA4CACHE_COMPILE_AHEAD="0")
    assert [r["stage"] for r in rows] == stages, rows
    return {r["stage"]: r for r in rows}


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = _run(SHARED, tmp_path_factory.mktemp("shared") / "store")
    for stage in ALONE:
        out.update(_run([stage], tmp_path_factory.mktemp(stage.replace(" ", "_")) / "store"))
    return out


def _expected(row: dict[str, Any]) -> dict[str, Any]:
    from tests.helpers.fail_open_worker import CALLS

    head_dim, _ = CALLS[row["stage"]]
    return {"out": [1, 256, 2, head_dim], "out_dtype": "torch.bfloat16", "lse": [1, 2, 256]}


def test_without_a_fault_the_kernel_is_stored_and_nothing_is_said(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["none"]
    assert row["error"] is None and row["returned"] == _expected(row)
    assert row["warnings"] == [] and row["new_objects"] == 1 and row["routed"]


@pytest.mark.parametrize("stage", [s for s in SHARED + ALONE if s != "none"])
def test_a_failing_stage_runs_fa4_as_without_fa4cache(
    rows: dict[str, dict[str, Any]], stage: str, record: Any
) -> None:
    row = rows[stage]
    record(
        f"fail open: {stage}", "the stage raises", f"error={row['error']}; warnings={len(row['warnings'])}"
    )
    assert row["error"] is None, row
    assert row["returned"] == _expected(row)
    named = [w for w in row["warnings"] if f"{stage} failed" in w]
    assert len(named) == 1, row["warnings"]
    assert "Fix:" in named[0]
    assert row["partial"] == [], "a half-written file stayed in the store"
    assert row["pending_locks"] == [], "a kernel's lock stayed held"


def test_what_cannot_be_keyed_or_written_is_not_stored(rows: dict[str, dict[str, Any]]) -> None:
    assert rows["key encoding"]["new_objects"] == 0
    assert rows["code identity"]["new_objects"] == 0
    assert rows["store write"]["new_objects"] == 0
    # The patch failed while FA4 was imported: FA4 ran on its own caches from then on.
    assert rows["patch"]["new_objects"] == 0 and not rows["patch"]["routed"]


def test_a_store_that_only_read_failed_still_keeps_the_kernel(rows: dict[str, dict[str, Any]]) -> None:
    # A read that fails is a miss: the compile still publishes (the next process loads it).
    assert rows["store read"]["new_objects"] == 1
    assert rows["lock"]["new_objects"] == 1
