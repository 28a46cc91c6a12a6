"""A decode step's key ranges (:mod:`.key_ranges`) computed once per step and kind of layer
in eager mode: every layer of a step gets the same mask tensor (transformers builds it once
per forward), so only the first layer of each kind pays for them."""

from __future__ import annotations

import weakref
from typing import Any

from . import key_ranges

# The step's (cu_seqlens_k, seqused_k), shared by the layers of one decode step: key ->
# (weak reference to the mask or position_ids it was computed from, checked, value). Every layer of a
# step gets the same mask tensor (transformers builds it once per forward), so only the first
# layer of each kind pays for it.
_step: dict[tuple[Any, ...], tuple[Any, bool, tuple[Any, Any]]] = {}


def _tensor_key(t: Any) -> tuple[Any, ...]:
    return (t.data_ptr(), t.device, tuple(t.shape), tuple(t.stride()), t.dtype, t._version)


def _shareable(src: Any) -> bool:
    """Whether a step's lengths may be kept for the next layer: not while torch.compile traces
    (fake tensors), nor for an inference tensor (it has no version to check), nor while a CUDA graph captures (a value kept between calls would stay
    alive in a CUDA-graph tree's memory pool without being one of the graph's outputs, which
    torch.compile's cudagraphs refuse; and a hand-captured graph must compute its own)."""
    import torch

    if torch.compiler.is_compiling():
        return False
    if src.is_inference():  # no version counter (inference_mode): a change in place would not be seen
        return False
    return not (src.is_cuda and torch.cuda.is_current_stream_capturing())


def sequences(
    attention_mask: Any,
    position_ids: Any,
    batch: int,
    heads_kv: int,
    keys: int,
    *,
    check: bool = True,
    share: bool = False,
    split: tuple[int, int] | None = None,
) -> tuple[Any, Any]:
    """:func:`.key_ranges._sequences`, computed once per decode step and kind of layer in eager mode: the
    layers after the first reuse it while the mask (or ``position_ids``) is the same tensor,
    unchanged (its storage, layout and version, and alive: a weak reference). ``share``: the
    caller is eager code (the adapter's direct call), never the custom op's body, whose body runs
    inside torch.compile's CUDA-graph trees (their warm-up runs in the graphs' pool)."""
    src = attention_mask if attention_mask is not None else position_ids
    if not share or src is None or not _shareable(src):
        return key_ranges._sequences(
            attention_mask, position_ids, batch, heads_kv, keys, check=check, split=split
        )
    key = (_tensor_key(src), attention_mask is None, batch, heads_kv, keys, split)
    hit = _step.get(key)
    if hit is not None and hit[0]() is src and (hit[1] or not check):
        return hit[2]
    value = key_ranges._sequences(
        attention_mask, position_ids, batch, heads_kv, keys, check=check, split=split
    )
    while len(_step) >= 8:  # a step has one or two kinds of layer (full and sliding)
        del _step[next(iter(_step))]  # the oldest: never the current step's other kind
    _step[key] = (weakref.ref(src), check, value)
    return value
