"""adapters/fa4/frozen_heap.py: while a kernel is compiled for the store the process's older
objects are out of the collector's reach, and after the last compile everything is back; a heap
someone else froze, or a collector turned off, is left alone. (That real store compiles run
inside it: tests/adapters/fa4/test_export_only.py, with ``WORKER_WATCH_FREEZE``.)"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
from fa4cache.adapters.fa4 import frozen_heap


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def test_older_objects_frozen_for_the_compile_and_back_after() -> None:
    older = [[i] for i in range(1000)]  # containers the collector tracks
    with frozen_heap.frozen():
        assert gc.get_freeze_count() >= len(older)
        young = [[i] for i in range(10)]
        frozen_now = gc.get_freeze_count()
        gc.collect()  # a full collection during the compile: the frozen ones stay frozen
        assert gc.get_freeze_count() == frozen_now
    assert gc.get_freeze_count() == 0
    del young


def test_cyclic_garbage_made_before_is_collected_after() -> None:
    import weakref

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    gone = weakref.ref(a)
    del a, b
    with frozen_heap.frozen():
        gc.collect()
        assert gone() is not None  # frozen: not collected during the compile
    gc.collect()
    assert gone() is None  # but not lost: collected after


def test_compiles_on_two_threads_share_one_freeze() -> None:
    inside, release = threading.Event(), threading.Event()
    seen: list[int] = []

    def other_compile() -> None:
        with frozen_heap.frozen():
            inside.set()
            release.wait(10)
            seen.append(gc.get_freeze_count())

    t = threading.Thread(target=other_compile)
    with frozen_heap.frozen():
        t.start()
        assert inside.wait(10)
    # this thread's compile ended first: the other one's is still frozen
    assert gc.get_freeze_count() > 0
    release.set()
    t.join(10)
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_someone_else_stays_frozen() -> None:
    gc.freeze()  # a fork server's, say
    before = gc.get_freeze_count()
    with frozen_heap.frozen():
        pass
    assert gc.get_freeze_count() >= before > 0


def test_a_collector_turned_off_is_left_off_and_nothing_frozen() -> None:
    gc.disable()
    with frozen_heap.frozen():
        assert gc.get_freeze_count() == 0
    assert not gc.isenabled()


def test_a_raising_compile_unfreezes() -> None:
    with pytest.raises(RuntimeError), frozen_heap.frozen():
        raise RuntimeError("the DSL failed")
    assert gc.get_freeze_count() == 0
