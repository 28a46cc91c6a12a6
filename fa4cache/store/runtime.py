"""What core code may ask of the running installation, filled in by the FA4 adapter.

Core modules (stats, the CLI's store commands) need to know whether this process
installed fa4cache, which store it uses and which toolchain it compiles for, without
importing the adapter (which knows FA4). The adapter registers itself here on
``install()`` and clears it on ``uninstall()``; the dependency points one way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fa4cache.fingerprint import Toolchain
    from fa4cache.store.store import Store

_lock = threading.Lock()
_store: Store | None = None
_toolchain: Callable[[], Toolchain] | None = None
_tl = threading.local()


def register(store: Store, toolchain: Callable[[], Toolchain]) -> None:
    global _store, _toolchain
    with _lock:
        _store, _toolchain = store, toolchain


def unregister() -> None:
    global _store, _toolchain
    with _lock:
        _store, _toolchain = None, None


def installed_store() -> Store | None:
    return _store


def current_toolchain() -> Toolchain | None:
    fn = _toolchain
    return fn() if fn is not None else None


@contextmanager
def record_spec(spec: dict[str, Any]) -> Iterator[None]:
    """Entries compiled inside this block record ``spec`` (``warm --replay`` reads it)."""
    prev = getattr(_tl, "spec", None)
    _tl.spec = spec
    try:
        yield
    finally:
        _tl.spec = prev


def recorded_spec() -> dict[str, Any] | None:
    return getattr(_tl, "spec", None)
