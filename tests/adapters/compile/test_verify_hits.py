"""``FA4CACHE_VERIFY_HITS``: stored hits compiled again in the background and compared.

A wrong entry is planted the way a key hole would file one: the bytes of another real
compile (the same mask at another window) under a key. A process that loads it with
``FA4CACHE_VERIFY_HITS=1`` must quarantine it, warn naming the kernel's kind and the mask's
qualified name, and count it; a correct entry it loads is compared and kept. Off (the
default), a process that loads from the store starts no compile server. All kernels are
real CuTe-DSL cross-compiles on the CPU (sm_90).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_identity_kernels import _entries, _side_by_side, _start, _write

pytestmark = pytest.mark.compile

_MAIN = """
import cutlass.cute as cute
from identity_runner import fa4_forward

@cute.jit
def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
    return n_idx <= m_idx + {w}

def run():
    fa4_forward(mask_mod)
"""


def _cases() -> dict[str, dict[str, tuple[str, str]]]:
    return {f"w{w}": {"MAIN": (_MAIN.format(w=w),) * 2} for w in (64, 128)}


def _plant(store_dir: Path, victim: Path, source: Path) -> tuple[str, str]:
    """``store_dir`` gets ``victim``'s fwd entry with ``source``'s bytes under it (a wrong entry,
    consistent in itself) and ``source``'s own entry as it is (a right one). Returns their digests."""
    from fa4cache.store.store import Store

    stores = {name: Store.at(p) for name, p in (("victim", victim), ("source", source))}
    (v,) = [e.ref for e in stores["victim"].entries() if e.ref.kind == "fwd"]
    (s,) = [e.ref for e in stores["source"].entries() if e.ref.kind == "fwd"]
    target = Store.at(store_dir)
    right = stores["source"].load(s, remote=False)
    assert right is not None
    side_v = stores["victim"].read_sidecar(v)
    assert side_v is not None
    assert target.publish_bytes(v, right.data, **side_v.facts())  # the wrong one
    assert target.publish_bytes(s, right.data, **right.sidecar.facts())  # the right one
    return v.digest, s.digest


def test_a_planted_wrong_entry_is_rebuilt_quarantined_warned_and_counted(tmp_path: Path) -> None:
    from fa4cache.store.stats import stats

    cases = _cases()
    src = tmp_path / "cases"
    _write(src, cases, 0)
    w64, w128 = tmp_path / "w64", tmp_path / "w128"
    _side_by_side(_start(src, w64, ["w64"]), _start(src, w128, ["w128"]))
    store = tmp_path / "planted"
    wrong, right = _plant(store, w64, w128)

    # Off (the default): the same hits, no compile server (nor any other cost: nothing registered).
    off = _side_by_side(_start(src, store, ["w128"], ahead=True))[0]
    assert (off["w128"]["disk_hits"], off["w128"]["compiles"]) == (1, 0), off
    assert off["_process"]["servers"] == 0, off

    on = _side_by_side(_start(src, store, ["w64", "w128"], FA4CACHE_VERIFY_HITS="1"))[0]
    for name in ("w64", "w128"):
        assert (on[name]["disk_hits"], on[name]["compiles"]) == (1, 0), on
    assert on["_process"]["servers"] == 1, on
    err = on["stderr"]
    assert "STORED KERNEL WAS WRONG: the fwd kernel of main_w64.mask_mod" in err, err[-3000:]
    assert err.count("STORED KERNEL WAS WRONG") == 1, err[-3000:]  # the right entry is not
    have = _entries(store)
    assert ("fwd", wrong) not in have, "the wrong entry is still served"
    assert ("fwd", right) in have, "the right entry was quarantined"
    assert any(p.name.startswith(wrong) for p in (store / "quarantine").iterdir())
    st = stats(store)
    assert (st["verified_hits"], st["verify_mismatches"], st["quarantined"]) == (2, 1, 1), st

    # The next process compiles the kernel again (its own bytes), and the store has them.
    again = _side_by_side(_start(src, store, ["w64"]))[0]
    assert (again["w64"]["disk_hits"], again["w64"]["compiles"]) == (0, 1), again
    assert _entries(store)[("fwd", wrong)] == _entries(w64)[("fwd", wrong)]
