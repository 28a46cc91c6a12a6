"""A kernel compiled for the store runs with the process's older objects out of the collector's reach.

The DSL's trace allocates as it runs Python (AST rewrites, MLIR values), so the collector runs
often during a compile, and now and then a full collection walks every object of the process:
torch's, FA4's and the DSL's modules, a model's, about 0.1-0.2 s each time on a GPU host. A cold
step's own compile is on its critical path, and where such a pause falls is chance (it moved
between runs of the same code by 0.2 s). While this thread compiles a kernel for the store,
:func:`frozen` moves the objects that existed before the compile to the collector's permanent
generation (``gc.freeze``): collections then walk only what the compile made, and at its end
everything goes back (``gc.unfreeze``) to be collected as before; nothing is lost, a cycle among
the older objects is collected later instead. Compiles on several threads share one freeze
(counted); a heap someone else froze, or a collector turned off, is left as it is.
``FA4CACHE_GC_FREEZE=0`` turns it off. (A compile server freezes its heap before it forks its
children, for their compiles: :func:`fa4cache.adapters.compile.worker.serve`.)
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0  # compiles in this process inside frozen() that froze or share the freeze


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """The objects of the process as they are now frozen until the last compile inside ends."""
    global _holders
    with _lock:
        mine = gc.isenabled() and (_holders > 0 or gc.get_freeze_count() == 0)
        if mine:
            if _holders == 0:
                gc.freeze()
            _holders += 1
    try:
        yield
    finally:
        if mine:
            with _lock:
                _holders -= 1
                if _holders == 0:
                    gc.unfreeze()


def _after_fork_in_child() -> None:
    """A child forked while another thread held the lock would wait on it forever. What the
    parent froze stays frozen in the child (its holders count it), as a fork server's would."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
