"""adapters/fa4/gc_deferred.py: while a kernel is compiled for the store no full collection
starts by itself (young ones go on), and after the last compile the collector's thresholds are
as they were; one someone else set meanwhile stays. (That real store compiles run inside it:
tests/adapters/fa4/test_export_only.py, with ``WORKER_WATCH_GC``.)"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
from fa4cache.adapters.fa4 import gc_deferred


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[tuple[int, ...]]:
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)
    gc.enable()


class Node:
    other: Node | None = None


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_full_collections_wait_for_the_compile_young_ones_go_on(thresholds: tuple[int, ...]) -> None:
    full: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.collect()
    gc.callbacks.append(seen)
    try:
        with gc_deferred.deferred():
            assert gc.get_threshold()[2] == gc_deferred.OUT_OF_REACH
            assert gc.get_threshold()[:2] == thresholds[:2]
            # kept allocations enough for tens of young collections, and a full one without
            # the deferral (the survivors outgrow a quarter of the heap)
            kept = [[] for _ in range(max(300_000, len(gc.get_objects())))]
            young = _cycle()  # garbage the compile makes: a young collection takes it
            gc.collect(0)
            gc.collect(1)
            assert young() is None
            assert not full  # none started by itself
            del kept
        assert gc.get_threshold() == thresholds
    finally:
        gc.callbacks.remove(seen)


def test_compiles_on_two_threads_share_one_deferral(thresholds: tuple[int, ...]) -> None:
    inside, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def other_compile() -> None:
        with gc_deferred.deferred():
            inside.set()
            release.wait(10)
            seen.append(gc.get_threshold()[2])

    t = threading.Thread(target=other_compile)
    with gc_deferred.deferred():
        t.start()
        assert inside.wait(10)
    assert gc.get_threshold()[2] == gc_deferred.OUT_OF_REACH  # the other compile goes on
    release.set()
    t.join(10)
    assert seen == [gc_deferred.OUT_OF_REACH]
    assert gc.get_threshold() == thresholds


def test_a_threshold_set_by_someone_else_meanwhile_stays() -> None:
    with gc_deferred.deferred():
        gc.set_threshold(1000, 20, 30)
    assert gc.get_threshold() == (1000, 20, 30)


def test_a_raising_compile_puts_the_thresholds_back(thresholds: tuple[int, ...]) -> None:
    with pytest.raises(RuntimeError), gc_deferred.deferred():
        raise RuntimeError("the DSL failed")
    assert gc.get_threshold() == thresholds


def test_garbage_of_the_compile_is_not_lost() -> None:
    with gc_deferred.deferred():
        gone = _cycle()
        gc.collect(0)
        gc.collect(1)  # survived two young collections: it waits in the oldest generation
    gc.collect()
    assert gone() is None


def test_a_child_forked_during_a_compile_gets_the_thresholds_back(thresholds: tuple[int, ...]) -> None:
    import json
    import os

    r, w = os.pipe()
    with gc_deferred.deferred():
        pid = os.fork()
        if pid == 0:  # the child: no compiling thread here
            os.write(w, json.dumps(gc.get_threshold()).encode())
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert tuple(json.loads(os.read(r, 100))) == thresholds


def test_a_save_and_restore_around_a_compile_end_does_not_keep_ours(thresholds: tuple[int, ...]) -> None:
    with gc_deferred.deferred():
        saved = gc.get_threshold()  # someone saves the thresholds during a compile,
    gc.set_threshold(*saved)  # and puts them back after it: ours, for good
    with gc_deferred.deferred():
        pass
    assert gc.get_threshold() == thresholds  # the next compile ends with theirs from before


def test_a_child_forked_by_the_compiling_thread_defers_its_own_later_compiles(
    thresholds: tuple[int, ...],
) -> None:
    import json
    import os

    r, w = os.pipe()
    with gc_deferred.deferred():
        pid = os.fork()
        if pid == 0:
            seen = [gc.get_threshold()[2]]  # (given back at the fork)
    if pid == 0:  # the child, its compile ended: a later one defers again, then restores
        with gc_deferred.deferred():
            seen.append(gc.get_threshold()[2])
        seen.append(gc.get_threshold()[2])
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert json.loads(os.read(r, 200)) == [thresholds[2], gc_deferred.OUT_OF_REACH, thresholds[2]]
