"""``fa4cache.attention(q, k, v, mask)``: one call that takes the fastest exact path for a mask.

* Document masks run on FA4's varlen kernels: the documents become varlen sequences, so
  tiles follow each document and none straddles a boundary, and the masking is FA4's
  own (no ``mask_mod``). ``[B, T, H, D]`` tensors are viewed as ``[B * T, H, D]`` and
  back. Causal, bidirectional and sliding-window masks are one call through FA4's
  varlen function; prefix-LM is two calls with disjoint query rows (the prefix
  bidirectional, the rest causal over the whole document, see :mod:`fa4cache.masks.varlen`).
* Everything else runs ``flash_attn_func`` with the mask's block-sparse metadata, as
  ``flash_attn_func(q, k, v, **mask)`` does: draft-block masks (a 16-token draft block
  would fill a 128-row varlen tile alone), custom templates.

No host sync on either path (``max_seqlen`` is used when the mask was given it), so the
call can be captured in a CUDA graph with :class:`~fa4cache.DocumentMaskBuilder` masks.

Under ``torch.compile`` the call runs eagerly between graphs (one graph break): FA4's
Python interface is not traceable. transformers models avoid the break through
:mod:`.packed_attention`, whose custom ops build the mask inside.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from fa4cache.errors import quiet_library_warnings
from fa4cache.masks.mask import AttentionMask
from fa4cache.validate import positive_number

if TYPE_CHECKING:
    from torch import Tensor


def _first(x: Any) -> Any:
    return x[0] if isinstance(x, tuple) else x


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: AttentionMask,
    *,
    softmax_scale: float | None = None,
    softcap: float | None = None,
    dense: bool = False,
) -> Tensor:
    """Attention of ``q`` ``[B, T, Hq, D]`` over ``k``/``v`` ``[B, T, Hkv, D]`` under ``mask``.

    ``softcap``: logit softcapping, ``cap * tanh(scores / cap)`` before the softmax (Gemma
    2), in FA4's kernels. ``dense=True`` forces the block-sparse dense path (for
    comparison). Returns ``[B, T, Hq, Dv]``.
    """
    if not isinstance(mask, AttentionMask):
        raise ValueError(
            f"mask: expected an AttentionMask (make_document_mask, ...), got {type(mask).__name__}"
        )
    mask.check(q)
    _check_inputs(q, k, v)
    if softcap is not None and softcap != 0 and not positive_number(softcap):
        raise ValueError(f"softcap: expected a positive number (0 or None: no softcapping), got {softcap!r}")
    softcap = float(softcap or 0.0)  # FA4's convention: 0 for none
    try:
        with quiet_library_warnings():  # CUTLASS's aux_data note on each compile: not the user's
            return _dispatch(q, k, v, mask, softmax_scale, softcap, dense)
    except AssertionError as e:
        # FA4 asserts its inputs are CUDA tensors; the bare assertion names neither the
        # tensor nor the fix. (Checked after the fact: tests run a CPU model of FA4 here.)
        if q.device.type != "cuda":
            raise ValueError(
                f"q: fa4cache.attention runs FA4's kernels, which need CUDA tensors; q, k and v are on "
                f"{q.device} (move them and the mask to a GPU, e.g. q.cuda())"
            ) from e
        raise


def _dispatch(
    q: Any, k: Any, v: Any, mask: AttentionMask, softmax_scale: float | None, softcap: float, dense: bool
) -> Any:
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    k, v = _kv_for_backward(q, k, v)
    if mask.varlen is None or dense:
        fitted = mask.for_head_dim(int(q.shape[-1]))
        return _first(flash_attn_func(q, k, v, softmax_scale=softmax_scale, softcap=softcap, **fitted))
    from . import varlen_calls

    q2, k2, v2 = (varlen_calls.flat_tokens(t) for t in (q, k, v))
    calls = mask.varlen.calls
    if len(calls) == 1:
        out = _first(
            flash_attn_varlen_func(
                q2, k2, v2, softmax_scale=softmax_scale, softcap=softcap, **mask.varlen.kwargs()
            )
        )
    else:
        out = varlen_calls.attention(q2, k2, v2, calls, softmax_scale, softcap)
    return out.view(*q.shape[:2], *out.shape[1:])


def _check_inputs(q: Any, k: Any, v: Any) -> None:
    """``ValueError`` naming the tensor for what FA4 would reject with a bare assertion
    (FA4's own messages for dtypes are clear, and its CPU test doubles take float32)."""
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4 or t.shape[:2] != q.shape[:2]:
            raise ValueError(
                f"{name}: shape {tuple(t.shape)} does not match q's batch and length {tuple(q.shape[:2])}"
            )
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k: head dim {k.shape[-1]} differs from q's {q.shape[-1]}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"v: {v.shape[2]} heads, k has {k.shape[2]}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(
            f"q: {q.shape[2]} query heads are not a multiple of k/v's {k.shape[2]} heads (GQA groups)"
        )


def _kv_for_backward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """FA4's backward refuses GQA when the value head dim differs from q/k's (192/128,
    say): there, k/v are expanded to q's heads (their gradients summed back by autograd),
    which is exact and costs the expansion; elsewhere they are returned as they are."""
    import torch

    group = q.shape[2] // k.shape[2]  # _check_inputs: a positive divisor
    if group == 1 or q.shape[-1] == v.shape[-1] or not torch.is_grad_enabled():
        return k, v
    if not (q.requires_grad or k.requires_grad or v.requires_grad):
        return k, v
    return k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)


def _between_compiled_graphs(fn: Any) -> Any:
    # torch is imported here: this module loads on the first use of fa4cache.attention.
    import torch

    return functools.wraps(fn)(torch.compiler.disable(fn, recursive=True))


attention = _between_compiled_graphs(attention)
