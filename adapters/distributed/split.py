"""Deprecated: a kernel set split across a job's nodes is ``fa4cache.warm(items, split=True)``
(:mod:`fa4cache.adapters.compile.runner`), over either engine's remote tier; the claiming
itself is :mod:`fa4cache.adapters.compile.split`. Kept so that old imports still work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fa4cache.adapters.compile.split import SplitResult, claim, compile_across, order

__all__ = ["SplitResult", "claim", "compile_across", "order", "warm_across"]


def warm_across(jobs: Sequence[Any]) -> Any:
    """Deprecated: ``fa4cache.warm([spec, ...], split=True)``. ``jobs``: ``SpecJob`` s; returns
    the :class:`~fa4cache.adapters.compile.report.WarmReport`."""
    from fa4cache.adapters.compile.runner import warm

    from fa4cache.aot.spec import KernelSpec

    return warm([KernelSpec.from_dict(j.spec) for j in jobs], split=True)
