"""FA4's compile cache observed for one thread's call: the key a kernel is taken under and
the arguments it is called with (what :func:`.plan.plan_of` makes a launch plan of)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class _Observed:
    """FA4's compile cache as one thread's call sees it: the key it takes a kernel under and
    the arguments it calls the kernel with are recorded; every other thread, and every
    other use, goes straight through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.thread = threading.get_ident()
        self.calls: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = []

    def __contains__(self, key: Any) -> bool:
        return key in self.inner

    def __getitem__(self, key: Any) -> Any:
        fn = self.inner[key]
        if threading.get_ident() != self.thread:
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((key, fn, args, kwargs))
            return fn(*args, **kwargs)

        return call

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.inner[key] = fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def observe(
    entry: Any, run: Callable[[], Any]
) -> tuple[Any, list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]]]:
    """``run()`` with ``entry``'s (FA4's ``_flash_attn_fwd``) compile cache observed:
    (its result, the kernel calls it made: key, function, arguments)."""
    inner = entry.compile_cache
    seen = _Observed(inner)
    entry.compile_cache = seen
    try:
        result = run()
    finally:
        if entry.compile_cache is seen:  # not if an install() put its own cache there meanwhile
            entry.compile_cache = inner
    return result, seen.calls


def unobserved(cache: Any) -> Any:
    """``cache`` itself, if another thread's :func:`observe` has it wrapped for the moment."""
    return cache.inner if isinstance(cache, _Observed) else cache
