"""adapters/fa4/compile_cache.py: a pending miss (the key's lock held while this thread
compiles) is recorded once however often FA4 asks, and ends when the kernel is stored; a kernel
compiled without the DSL's JIT engine that is called after all runs the bytes published for it.

The store, its locks and threads are real; the compiler is tests/helpers/fake_compiler.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fa4cache.adapters.fa4.compile_cache import RECOMPILE, StoreCompileCache, store_miss_pending
from fa4cache.adapters.route import Route

from fa4cache.store.store import Store
from tests.helpers.fake_compiler import FakeCompiled, fake_load, installation


class Engineless(FakeCompiled):
    """A kernel as the DSL returns it compiled with ``no_jit_engine``: exportable, not callable."""

    engine = None

    def __call__(self, x: int) -> int:
        raise RuntimeError("The compiled function does not have a valid execution engine.")


def _in_thread(fn: Any, timeout: float = 20.0) -> Any:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "blocked: the key's lock was never released"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_key_asked_twice_before_it_is_stored_is_one_pending_miss(tmp_path: Path) -> None:
    store = Store(cache_dir=tmp_path / "cache")
    cache = StoreCompileCache("fwd", installation(store))

    def compile_as_fa4_may() -> tuple[bool, bool, bool]:
        missed = 7 not in cache and 7 not in cache  # asked twice before it stores
        during = store_miss_pending()
        cache[7] = FakeCompiled(7)
        return missed, during, store_miss_pending()

    assert _in_thread(compile_as_fa4_may) == (True, True, False)  # nothing left pending after
    other = StoreCompileCache("fwd", installation(store))
    assert _in_thread(lambda: 7 in other)  # the lock is free and the kernel stored
    assert store.counters.snapshot()["counters"]["misses"] == 1


@pytest.mark.parametrize("case", ["published", "not published", "not published, compiled again"])
def test_an_engineless_kernel_called_runs_the_published_bytes_or_its_own_compile(
    tmp_path: Path, case: str
) -> None:
    store = Store(cache_dir=tmp_path / "cache")
    inst = installation(store)
    if case != "published":

        def broken_export(fn: Any, path: Path) -> bool:
            raise OSError(28, "No space left on device")

        inst = Route(store, loader=fake_load, exporter=broken_export)
        inst._toolchain = installation(store)._toolchain
    cache = StoreCompileCache("fwd", inst)
    assert 5 not in cache
    fn = Engineless(5)
    if case.endswith("compiled again"):  # as export_only's wrapper leaves it: the DSL's own compile
        setattr(fn, RECOMPILE, lambda: FakeCompiled(5))
    cache[5] = fn
    assert cache[5].engine is None  # what a caller asks of the compiled function is its own
    if case == "not published":
        with pytest.raises(RuntimeError, match="FA4CACHE_EXPORT_ONLY=0"):
            cache[5](1)
        return
    assert cache[5](1) == 6
    assert type(cache.cache[5]) is FakeCompiled  # loaded or compiled once, then it runs
    assert cache[5](2) == 7


def test_a_miss_released_without_a_kernel_leaves_nothing_pending(tmp_path: Path) -> None:
    # A compile that failed (adapters/jit's path, uninstall) releases the key: the thread
    # compiles nothing for the store any more, and another thread's miss waits on its own lock.
    store = Store(cache_dir=tmp_path / "cache")
    cache = StoreCompileCache("fwd", installation(store))

    def miss_then_release() -> bool:
        assert 7 not in cache and store_miss_pending()
        cache.release_pending(7)
        return store_miss_pending()

    assert _in_thread(miss_then_release) is False


def test_an_engineless_kernel_kept_in_memory_is_compiled_again_when_called(tmp_path: Path) -> None:
    store = Store(cache_dir=tmp_path / "cache")
    cache = StoreCompileCache("fwd", installation(store))
    cache._unkeyed.add(9)  # a key fa4cache could not encode: memory only, never stored
    assert 9 not in cache
    fn = Engineless(9)
    setattr(fn, RECOMPILE, lambda: FakeCompiled(9))
    cache[9] = fn
    assert cache[9](1) == 10 and type(cache.cache[9]) is FakeCompiled


def test_two_threads_compiling_one_key_without_a_lock_each_leave_a_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No lock between the threads (a lock timeout, an unusable lock file): both miss the key,
    # both compile it engine-less and store it. Each store leaves the stand-in (never the
    # engine-less kernel) and no pending record in its thread.
    store = Store(cache_dir=tmp_path / "cache")
    monkeypatch.setattr(store.locks, "acquire", lambda digest, timeout=None: None)
    cache = StoreCompileCache("fwd", installation(store))
    both_missed = threading.Barrier(2)

    def compile_it() -> bool:
        assert 3 not in cache
        both_missed.wait(10)
        fn = Engineless(3)
        setattr(fn, RECOMPILE, lambda: FakeCompiled(3))
        cache[3] = fn
        return store_miss_pending()

    threads = [threading.Thread(target=lambda: left.append(compile_it())) for _ in range(2)]
    left: list[bool] = []
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert left == [False, False] and cache._pending == {}
    assert cache[3](1) == 4  # the published bytes run


def test_a_thread_that_finds_the_key_while_it_is_published_gets_the_stand_in(tmp_path: Path) -> None:
    store = Store(cache_dir=tmp_path / "cache")
    inst = installation(store)
    exporting, go_on = threading.Event(), threading.Event()
    export = inst.exporter

    def slow_export(fn: Any, path: Path) -> Any:
        exporting.set()
        go_on.wait(10)
        return export(fn, path)

    inst.exporter = slow_export
    cache = StoreCompileCache("fwd", inst)

    def compile_it() -> None:
        assert 4 not in cache
        fn = Engineless(4)
        setattr(fn, RECOMPILE, lambda: FakeCompiled(4))
        cache[4] = fn

    t = threading.Thread(target=compile_it)
    t.start()
    try:
        assert exporting.wait(10)
        assert 4 in cache and cache[4](1) == 5  # during the publish: runs (compiled again), never fails
    finally:
        go_on.set()
        t.join(20)


def test_a_read_only_store_or_a_patched_process_compiles_with_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing would be published, so a kernel compiled engine-less would be compiled twice.
    from fa4cache.adapters.fa4.compile_cache import pending_kind

    store = Store(cache_dir=tmp_path / "cache")
    cache = StoreCompileCache("fwd", installation(store))

    def kind_while_pending() -> Any:
        assert 6 not in cache
        try:
            return pending_kind()
        finally:
            cache.release_pending(6)

    assert _in_thread(kind_while_pending) == "fwd"
    from fa4cache.adapters.fa4 import compile_cache

    with monkeypatch.context() as m:  # a patched process: its kernels stay in memory, never published
        m.setattr(compile_cache, "found_once", lambda: ("flash_attn.cute.mask.call_mask_mod (x.py)",))
        assert _in_thread(kind_while_pending) is None
    monkeypatch.setattr(store, "writable", False)
    assert _in_thread(kind_while_pending) is None
