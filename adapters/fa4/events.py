"""What FA4's compile caches tell the layers above them, typed: the stages of a miss, and the
wrappers FA4's entry points get when they are patched.

Compile-ahead (:mod:`fa4cache.adapters.compile.ahead`) and the hit spot-check
(:mod:`fa4cache.adapters.compile.verify_hits`) listen here; the caches and the
patcher call whoever registered without importing them, so the dependency points one way.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fa4cache.store.paths import EntryRef

log = logging.getLogger(__name__)


class MissStage(enum.Enum):
    WAITING = "waiting"  # before blocking on another process's lock of the key
    COMPILING = "compiling"  # this process will compile the kernel
    LOADED = "loaded"  # the store had it (after a wait, or at once)


@dataclass(frozen=True)
class MissEvent:
    """One stage of a miss (never sent on a memory hit)."""

    stage: MissStage
    kind: str  # the store kind of the cache that missed ("fwd", "bwd", ...)
    key: Any  # FA4's own compile key
    ref: EntryRef
    waited: float = 0.0  # seconds since the miss (LOADED)


MissListener = Callable[[MissEvent], None]
ForwardWrapper = Callable[[Callable[..., Any]], Callable[..., Any]]
EntryWrapper = Callable[[str, Callable[..., Any]], Callable[..., Any]]

_lock = threading.Lock()
_listeners: list[MissListener] = []
_forward_wrappers: list[ForwardWrapper] = []
_entry_wrappers: list[EntryWrapper] = []


def listen(listener: MissListener) -> None:
    """Call ``listener(event)`` at every stage of every miss, in this process."""
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


def notify(event: MissEvent) -> None:
    for listener in tuple(_listeners):
        try:
            listener(event)
        except Exception as e:  # a helper's trouble must never fail the kernel call
            from fa4cache.adapters.fa4 import fail_open

            fail_open.failed(fail_open.Stage.COMPILE_SERVER, e, what=f"a {event.kind} miss")


def wrap_forward(wrapper: ForwardWrapper) -> None:
    """Wrap FA4's forward entry point with ``wrapper`` whenever the patcher patches it."""
    with _lock:
        if wrapper not in _forward_wrappers:
            _forward_wrappers.append(wrapper)


def forward_wrappers() -> tuple[ForwardWrapper, ...]:
    return tuple(_forward_wrappers)


def wrap_entry(wrapper: EntryWrapper) -> None:
    """Wrap each of FA4's interface entry points (forward and backward) with
    ``wrapper(name, fn)`` whenever the patcher patches them. Registered only by features that
    are on (``FA4CACHE_VERIFY_HITS``): an entry point nobody asked to watch stays as it is."""
    with _lock:
        if wrapper not in _entry_wrappers:
            _entry_wrappers.append(wrapper)


def entry_wrappers() -> tuple[EntryWrapper, ...]:
    return tuple(_entry_wrappers)
