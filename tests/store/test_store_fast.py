"""Store and lock semantics in milliseconds, through the real compile-cache protocol with a
fake compiler (see tests/helpers/fake_compiler.py); real processes where processes matter."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from fa4cache.store.maintenance import prune, verify
from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Store
from tests.helpers.fake_compiler import TOOLCHAIN, FakeFA4


def _store(root: Path, **options: object) -> Store:
    return Store.at(root, **options)


def _only_ref(store: Store) -> EntryRef:
    (e,) = list(store.layout.iter_entries())
    return e.ref


def test_miss_compiles_publishes_and_a_new_process_loads(tmp_path: Path) -> None:
    a = FakeFA4(_store(tmp_path / "c"))
    assert a.call(5, 1) == 6 and a.compiles == 1
    assert a.call(5, 2) == 7 and a.compiles == 1  # memory hit
    b = FakeFA4(_store(tmp_path / "c"))  # a fresh cache: what a new process has
    assert b.call(5, 1) == 6 and b.compiles == 0
    assert b.cache._inst.store.counters.values["disk_hits"] == 1


def test_uses_are_recorded_beside_a_write_once_sidecar(tmp_path: Path) -> None:
    store = _store(tmp_path / "c")
    FakeFA4(store).call(3, 0)
    ref = _only_ref(store)
    sidecar = store.layout.sidecar_path(ref).read_bytes()
    for _ in range(3):
        FakeFA4(store).call(3, 0)
        store.flush_touches()
    assert store.layout.sidecar_path(ref).read_bytes() == sidecar
    use = store.read_use(ref)
    assert use is not None and use.hits == 3


def test_a_failing_compile_releases_the_key_lock(tmp_path: Path) -> None:
    store = _store(tmp_path / "c", lock_timeout=30)
    with pytest.raises(RuntimeError, match="compile failed"):
        FakeFA4(store, fail=True).call(9, 0)
    digests = [p.stem for p in store.layout.locks_dir.glob("*.lock")]
    assert digests and not any(store.locks.held_by_other(d) for d in digests)
    assert FakeFA4(store).call(9, 1) == 10  # would wait 30 s on a leaked lock


def _cold_process(root: str, q: multiprocessing.Queue) -> None:
    fa = FakeFA4(Store.at(root), compile_seconds=0.3)
    fa.call(7, 0)
    q.put(fa.compiles)


def test_cold_processes_compile_each_key_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_cold_process, args=(str(tmp_path / "c"), q)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sorted(q.get() for _ in procs) == [0, 0, 0, 0, 0, 1]


def test_corrupt_entry_is_quarantined_but_a_failing_loader_is_not(tmp_path: Path) -> None:
    store = _store(tmp_path / "c")
    FakeFA4(store).call(4, 0)
    ref = _only_ref(store)
    # A loader that raises (say, CUDA out of memory) on good bytes: a miss, nothing moved.
    fa = FakeFA4(store)

    def oom(art: object) -> None:
        raise MemoryError("CUDA out of memory")

    fa.cache._inst.loader = oom
    assert fa.call(4, 0) == 4 and fa.compiles == 1
    assert not list(store.layout.quarantine_dir.glob("*.o"))
    # Flipped bytes: an integrity failure, quarantined, recompiled.
    obj = store.layout.object_path(ref)
    data = bytearray(obj.read_bytes())
    data[10] ^= 0xFF
    obj.write_bytes(bytes(data))
    fb = FakeFA4(store)
    assert fb.call(4, 1) == 5 and fb.compiles == 1
    assert len(list(store.layout.quarantine_dir.glob("*.o"))) == 1


def test_a_reader_racing_a_republish_quarantines_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path / "c")
    FakeFA4(store).call(4, 0)
    ref = _only_ref(store)
    # Mid-republish: the publisher holds the key lock, the artifact is new, the sidecar old.
    lk = store.locks.try_lock(ref.digest)
    assert lk is not None
    try:
        store.layout.object_path(ref).write_bytes(b"newer bytes of another compile" * 10)
        assert store.load(ref) is None
        assert not list(store.layout.quarantine_dir.glob("*"))
    finally:
        lk.release()
    assert store.load(ref) is None  # now, under the lock, it is judged corrupt
    assert list(store.layout.quarantine_dir.glob("*.o"))


def test_verify_and_prune_by_recorded_use(tmp_path: Path) -> None:
    store = _store(tmp_path / "c")
    FakeFA4(store).call(1, 0)
    FakeFA4(store).call(2, 0)
    rep = verify(store)
    assert rep.checked == 2 and rep.ok == 2 and rep.clean
    # Another toolchain, used two days ago: stale; ours (most recent): kept.
    old = "0123456789abcdef0123"
    store.record_toolchain(old, {"id": old})
    (store.layout.kind_dir(EntryRef(old, "fwd", "0" * 64))).mkdir(parents=True, mode=0o700)
    os.utime(store.layout.toolchain_dir(old) / "toolchain.json", (1, 1))
    staged = store.staging_path(EntryRef(old, "fwd", "0" * 64))
    assert staged is not None
    staged.write_bytes(b"x" * 100)
    assert store.publish(EntryRef(old, "fwd", "0" * 64), staged)
    rep = prune(store, stale_after=86400)
    assert [e.ref.toolchain for e in rep.removed] == [old]
    assert {e.ref.toolchain for e in store.layout.iter_entries()} == {TOOLCHAIN.id}


def test_a_waiter_takes_a_released_key_lock_within_milliseconds(tmp_path: Path) -> None:
    # A first step waiting on another process's compile waits for its lock: the wait ends
    # within a few milliseconds of the release, not at filelock's 50 ms polling.
    import statistics
    import subprocess
    import sys
    import time

    from fa4cache.store.locks import KeyLocks, release

    locks = KeyLocks(tmp_path)
    lags = []
    for _ in range(5):
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(locks.path("k" * 64))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == b"held"
        holder.stdin.close()  # it releases when its stdin closes, and says when
        got = locks.wait("k" * 64, timeout=10)
        taken = time.time()
        released = float(holder.stdout.readline())
        holder.wait(10)
        assert got.lock is not None
        release(got.lock)
        lags.append(taken - released)
    assert statistics.median(lags) < 0.02, lags


HOLD = """
import sys, time, filelock
lk = filelock.FileLock(sys.argv[1], is_singleton=False)
lk.acquire()
print("held", flush=True)
sys.stdin.read()
lk.release()
print(time.time(), flush=True)
"""
