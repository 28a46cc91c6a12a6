"""Stores the CLI's tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4cache.store.store import Store
from tests.helpers.cli_stores import EMPTY, OLD, age_toolchain, publish


@pytest.fixture
def two_toolchains(tmp_path: Path) -> Path:
    """A store whose kernels belong to OLD (used an hour ago), and an EMPTY toolchain recorded
    since (what a failed start used to leave behind)."""
    root = tmp_path / "cache"
    store = Store.at(root)
    spec = {"mask": "document", "dtype": "bf16", "head_dim": 128, "window": 256, "block_size": 16}
    store.record_toolchain(OLD, {"id": OLD})
    publish(store, OLD, "fwd", 1, spec=spec)
    publish(store, OLD, "bwd", 2, spec=spec)
    age_toolchain(store, OLD, 3600)
    store.record_toolchain(EMPTY, {"id": EMPTY})
    return root
