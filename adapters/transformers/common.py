"""Names shared by the adapter's modules."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

# One logger for the whole adapter (what tests and users filter on).
log = logging.getLogger("fa4cache.adapters.transformers")

NAME = "fa4cache"
# Both names the adapter registers: "paged|fa4cache" for code written for transformers before
# 5.2x, which accepts a "paged|" implementation only when that exact name is registered.
NAMES = (NAME, f"paged|{NAME}")
warned: set[str] = set()


def warn_once(tag: str, message: str) -> None:
    """One warning per ``tag`` and process, from eager or traced code. Traced (a compiled
    prefill with Llama 4's chunks), a logging call would break the graph, and dynamo's
    reorderable logging keeps none from inlined frames: the warning is made while tracing,
    through ``assume_constant_result`` (dynamo runs that eagerly), set up by ``register()``."""
    if not compiling():
        _warn(tag, message)
    elif _traced_warning:
        _traced_warning[0](tag, message)


def _warn(tag: str, message: str) -> bool:
    if tag not in warned:
        warned.add(tag)
        log.warning(message)
    return True


_traced_warning: list[Callable[[str, str], bool]] = []


def warn_while_tracing_too() -> None:
    """Wraps :func:`_warn` for traced calls (the wrapping itself cannot happen while tracing)."""
    import torch

    if not _traced_warning:
        _traced_warning.append(torch.compiler.assume_constant_result(_warn))


def first_kwarg(kwargs: dict[str, Any], *names: str) -> Any:
    for n in names:
        if kwargs.get(n) is not None:
            return kwargs[n]
    return None


def host_int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def per_layer_type(value: Any, sliding_window: int | None) -> Any:
    """Continuous batching's per-layer-type value (``cu_seq_lens_k``, ``max_seqlen_k``: a dict
    by layer type when a model mixes full and sliding layers) for this layer."""
    if isinstance(value, dict):
        return value["sliding_attention" if sliding_window else "full_attention"]
    return value


def compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def patch_once(owner: Any, name: str, wrap: Callable[[Any], Callable[..., Any]]) -> None:
    """``owner.name`` replaced by ``wrap(owner.name)`` (its name and docs kept), unless an
    earlier ``register()`` did it already."""
    fn = getattr(owner, name)
    if getattr(fn, "__fa4cache__", False):
        return
    patched = functools.wraps(fn)(wrap(fn))
    patched.__fa4cache__ = True  # type: ignore[attr-defined]
    setattr(owner, name, patched)
