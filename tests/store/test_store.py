"""The store (fa4cache/store/store.py) without a compile: the size cap, refs that cannot carry paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4cache.errors import ConfigError
from fa4cache.store import EntryRef, Store


def test_max_size_is_enforced_after_each_publish(tmp_path: Path) -> None:
    from tests.helpers.fake_compiler import FakeFA4

    store = Store.at(tmp_path / "c", max_size=5_000)
    fa4 = FakeFA4(store)
    for key in range(8):
        assert fa4.call(key, 1) == key + 1
    sizes = [e.size for e in store.layout.iter_entries()]
    assert sum(sizes) <= 5_000 and len(sizes) >= 1
    assert store.counters.values["evictions"] >= 8 - len(sizes)
    # The most recent publish survives the cap: a fresh process-like cache loads it, compiling 0.
    fresh = FakeFA4(Store.at(tmp_path / "c"))
    assert fresh.call(7, 1) == 8 and fresh.compiles == 0


def test_refs_cannot_carry_paths() -> None:
    with pytest.raises(ConfigError):
        EntryRef("ab" * 10, "../fwd", "0" * 64)
    with pytest.raises(ConfigError):
        EntryRef("ab" * 10, "fwd", "../../etc/passwd")
