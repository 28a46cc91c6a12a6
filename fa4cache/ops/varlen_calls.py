"""Run a layout of several FA4 varlen calls (:class:`fa4cache.masks.varlen.VarlenCall`) as one
attention, forward and backward.

The calls write disjoint query rows of one output and one LSE, so the forward needs no
merging; in the backward each call's dQ rows are its own, and keys that several calls
read get the sum of their dK/dV. FA4's private ``_flash_attn_fwd``/``_flash_attn_bwd``
take the preallocated outputs that makes possible (its public varlen function
allocates its own). The same two functions serve :func:`fa4cache.attention` and the
cross-compiler (called under ``FakeTensorMode``, where autograd cannot run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fa4cache.masks.varlen import VarlenCall


def flat_tokens(t: Any) -> Any:
    """``[B, T, ...]`` as ``[B * T, ...]``, the tokens FA4's varlen calls index (a view where
    the layout allows, else a copy)."""
    B, T = t.shape[:2]
    return t.reshape(B * T, *t.shape[2:])


def forward(
    q: Any,
    k: Any,
    v: Any,
    calls: Sequence[VarlenCall],
    softmax_scale: float | None,
    softcap: float = 0.0,
) -> tuple[Any, Any]:
    """``(out, lse)`` for ``q``/``k``/``v`` flattened to ``[tokens, heads, head_dim]``;
    ``softcap``: FA4's logit softcapping (``cap * tanh(scores / cap)``), 0 for none."""
    import torch
    from flash_attn.cute import interface as fi

    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for call in calls:
        fi._flash_attn_fwd(
            q, k, v, softmax_scale=softmax_scale, softcap=softcap, out=out, lse=lse,
            return_lse=True, **call.fa4_kwargs(),
        )  # fmt: skip
    return out, lse


def backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    dout: Any,
    lse: Any,
    calls: Sequence[VarlenCall],
    softmax_scale: float | None,
    softcap: float = 0.0,
) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)``: the first call writes dK/dV for every key (its keys cover all
    tokens); a later call writes its own key rows of scratch buffers, and only those rows
    are added (:mod:`.sequence_add`)."""
    import torch
    from flash_attn.cute import interface as fi

    from .sequence_add import add_sequences_

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scratch: tuple[Any, Any] | None = None
    for i, call in enumerate(calls):
        if i and scratch is None:
            # Left unzeroed: FA4 writes the call's key rows, and only those are read.
            scratch = (torch.empty_like(k), torch.empty_like(v))
        dk_i, dv_i = (dk, dv) if i == 0 else scratch
        fi._flash_attn_bwd(
            q, k, v, out, dout, lse, softmax_scale, softcap=softcap, dq=dq, dk=dk_i, dv=dv_i,
            **call.fa4_kwargs(),
        )  # fmt: skip
        if i:
            add_sequences_(dk, dk_i, call.cu_seqlens_k, call.seqused_k)
            add_sequences_(dv, dv_i, call.cu_seqlens_k, call.seqused_k)
    return dq, dk, dv


def _function() -> Any:
    import torch

    class VarlenCalls(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, calls: Any, softmax_scale: Any, softcap: Any) -> Any:  # type: ignore[override]
            out, lse = forward(q, k, v, calls, softmax_scale, softcap)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.calls, ctx.softmax_scale, ctx.softcap = calls, softmax_scale, softcap
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:  # type: ignore[override]
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = backward(
                q, k, v, out, dout.contiguous(), lse, ctx.calls, ctx.softmax_scale, ctx.softcap
            )
            return dq, dk, dv, None, None, None

    return VarlenCalls


_FUNCTION: Any = None


def attention(
    q: Any,
    k: Any,
    v: Any,
    calls: Sequence[VarlenCall],
    softmax_scale: float | None,
    softcap: float = 0.0,
) -> Any:
    """Attention over ``calls`` with autograd; ``q``/``k``/``v``: ``[tokens, heads, head_dim]``."""
    global _FUNCTION
    if _FUNCTION is None:  # torch is imported on first use, not with the module
        _FUNCTION = _function()
    return _FUNCTION.apply(q, k, v, tuple(calls), softmax_scale, softcap)
