"""No full garbage collection while a kernel is compiled for the store.

The DSL's trace allocates as it runs Python (AST rewrites, MLIR values), so the collector runs
often during a compile, and now and then a full collection walks every object of the process:
torch's, FA4's and the DSL's modules, a model's: 0.18-0.24 s each on the H100 host, and one
fell at the start of the forward's compile in 2 of 3 cold steps and 3 of 3 floor steps there.
While this thread compiles a kernel for the store, :func:`deferred` raises the oldest
generation's threshold out of reach: young collections go on (the compile's own garbage is
collected), full ones wait until the compile ends, when the threshold goes back and the next
one runs as the collector decides. Nothing is lost; a cycle that survived two young collections
during the compile is collected at that later full collection. Compiles on several threads
share one deferral (counted). A threshold changed by someone else meanwhile is theirs and stays;
a collector turned off is left off; where the collector has no oldest-generation threshold to
speak of (an incremental or free-threaded one), it buys nothing and costs nothing.
``FA4CACHE_GC_DEFER=0`` turns it off. (Freezing the heap,
``gc.freeze``, would defer the same pause but cannot be undone only in part: Python 3.12 starts
with objects of its own frozen. A compile server freezes its heap before it forks its children:
:func:`fa4cache.adapters.compile.worker.serve`.)
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

OUT_OF_REACH = 1 << 30  # the oldest generation's threshold during a compile
_lock = threading.Lock()
_holders = 0  # compiles inside deferred() now
_theirs: tuple[int, ...] = ()  # the thresholds before the first of them (never ours)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """No full collection starts by itself until the last compile inside this ends."""
    global _holders
    entered = False
    try:
        with _lock:
            _holders += 1
            entered = True
            if _holders == 1:
                _raise()
        yield
    finally:
        if entered:
            with _lock:
                _holders = max(_holders - 1, 0)  # (a forked child starts again from 0)
                if _holders == 0:
                    _restore()


def _raise() -> None:
    global _theirs
    now = gc.get_threshold()
    if len(now) != 3:
        return
    if now[2] != OUT_OF_REACH:  # (ours left by someone who saved it during a compile and put it
        _theirs = now  # back after: the value before it stays the one to restore)
    elif not _theirs:
        _theirs = (*now[:2], 10)  # (CPython's default)
    gc.set_threshold(*now[:2], OUT_OF_REACH)


def _restore() -> None:
    now = gc.get_threshold()
    if len(now) == 3 and now[2] == OUT_OF_REACH and _theirs:  # (not changed by someone else since)
        gc.set_threshold(*now[:2], _theirs[2])


def _after_fork_in_child() -> None:
    """A child forked while another thread held the lock would wait on it forever; one forked
    during a compile (a data loader's worker) has no compile of its own to wait for: its
    collector gets its thresholds back (a compile of the forking thread that ends in the child
    then finds nothing to restore)."""
    global _lock, _holders
    _lock = threading.Lock()
    if _holders:
        _holders = 0
        _restore()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
