"""adapters/fa4/export_only.py: a GPU-blind process compiles the kernels it only exports
without the DSL's JIT engine, and the store gets the same bytes as with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fa4cache.store.paths import LAYOUT
from tests.conftest import run_worker

pytestmark = pytest.mark.compile


def _objects(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted((d / LAYOUT).glob("*/*/*.o"))}


def test_kernels_compiled_without_the_engine_export_the_same_bytes(
    doc_store: dict[str, Any], tmp_path: Path
) -> None:
    # doc_store's process compiled its kernel set export-only (the default here: no GPU); this
    # one builds the DSL's engines as a GPU process would, for the first of the same layouts.
    assert doc_store["result"]["engineless"] == 4, doc_store["result"]
    r = run_worker(
        tmp_path / "cache", "geometries", "--geometries", "1", "--seed", "7", PYTHONHASHSEED="1",
        FA4CACHE_EXPORT_ONLY="0",
    )  # fmt: skip
    assert r["compiles"] == 4 and r["engineless"] == 0, r
    with_engine, without = _objects(tmp_path / "cache"), _objects(doc_store["dir"])
    assert len(with_engine) == 4 and with_engine.keys() == without.keys()
    assert with_engine == without
