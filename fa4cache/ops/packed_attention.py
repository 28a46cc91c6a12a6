"""Attention over a packed step's documents as two torch custom ops, forward and backward.

``torch.ops.fa4cache.packed_attention(q, k, v, source, kind, ...)`` takes the tensor the
documents come from (``kind``: ``"cu_seqlens"``, ``"padding"`` or ``"position_ids"``), finds
the step's mask (:func:`~.step_mask.step_mask`: built by the first layer, shared by the
rest) and runs its FA4 varlen calls (:mod:`.varlen_calls`). To ``torch.compile`` each op is
one opaque node with a shape function, so a model around it compiles into one graph (no
graph break per layer) and its other ops fuse across the attention, as they do around
flex_attention; FA4's Python interface and the mask cache never meet the tracer.

:func:`forward` and :func:`backward` are the ops' bodies as plain functions: the
cross-compiler calls them under ``FakeTensorMode``, where the ops themselves would only
run their shape functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import varlen_calls
from .step_mask import SOURCES, step_mask
from .varlen_calls import flat_tokens

if TYPE_CHECKING:
    from torch import Tensor


def _mask(q: Any, source: Any, kind: str, causal: bool, window: int | None, max_seqlen: int | None) -> Any:
    if kind not in SOURCES:
        raise ValueError(f"kind: expected one of {SOURCES}, got {kind!r}")
    B, T = q.shape[:2]
    return step_mask(batch=B, seqlen=T, causal=causal, window=window, max_seqlen=max_seqlen, **{kind: source})


def _laid_out_like(g: Tensor, flat: Tensor) -> Tensor:
    """``g`` with the strides of ``empty_like(flat)``: what FA4 allocates, and what the
    shape functions promise the compiler (a compiled graph reads outputs by those strides)."""
    if g.stride() == flat.stride():
        return g
    import torch

    return torch.empty_like(flat).copy_(g)


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    source: Tensor,
    kind: str,
    causal: bool,
    window: int | None,
    softmax_scale: float,
    softcap: float,
    max_seqlen: int | None,
) -> tuple[Tensor, Tensor]:
    """``(out [B, T, Hq, Dv], lse [Hq, B * T])`` for ``q`` ``[B, T, Hq, D]``; ``softcap``
    0 for none."""
    mask = _mask(q, source, kind, causal, window, max_seqlen)
    out, lse = varlen_calls.forward(
        flat_tokens(q), flat_tokens(k), flat_tokens(v), mask.varlen.calls, softmax_scale, softcap
    )
    return out.contiguous().view(*q.shape[:3], v.shape[-1]), lse.contiguous()


def backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    source: Tensor,
    kind: str,
    causal: bool,
    window: int | None,
    softmax_scale: float,
    softcap: float,
    max_seqlen: int | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)``, shaped as ``q``, ``k``, ``v``."""
    mask = _mask(q, source, kind, causal, window, max_seqlen)
    flat = [flat_tokens(t) for t in (q, k, v)]
    grads = varlen_calls.backward(
        *flat, flat_tokens(out), flat_tokens(dout).contiguous(), lse, mask.varlen.calls,
        softmax_scale, softcap,
    )  # fmt: skip
    return tuple(_laid_out_like(g, f).view(t.shape) for g, f, t in zip(grads, flat, (q, k, v)))  # type: ignore[return-value]


_OPS: list[Any] = []
_LIB: list[Any] = []  # the torch.library.Library the ops live in (kept alive with the module)


def op() -> Any:
    """``torch.ops.fa4cache.packed_attention``, defined on first use (torch is imported then)."""
    if not _OPS:
        import torch

        _LIB.append(torch.library.Library("fa4cache", "FRAGMENT"))
        _OPS.append(_define())
    return _OPS[0]


def _define() -> Any:
    import torch

    # define + impl rather than @custom_op: the bodies above are the implementations as
    # they are, with the schema written once here.
    args = "Tensor source, str kind, bool causal, int? window, float softmax_scale, float softcap, int? max_seqlen"
    fwd, bwd = "fa4cache::packed_attention", "fa4cache::packed_attention_backward"
    tags = (torch.Tag.pt2_compliant_tag,)  # as @custom_op marks its ops
    torch.library.define(
        fwd, f"(Tensor q, Tensor k, Tensor v, {args}) -> (Tensor, Tensor)", lib=_LIB[0], tags=tags
    )
    torch.library.define(
        bwd,
        f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {args}) -> (Tensor, Tensor, Tensor)",
        lib=_LIB[0],
        tags=tags,
    )
    torch.library.impl(fwd, "default", forward, lib=_LIB[0])
    torch.library.impl(bwd, "default", backward, lib=_LIB[0])

    @torch.library.register_fake(fwd, lib=_LIB[0])
    def _(q, k, v, *rest):  # type: ignore[no-untyped-def]
        B, T, H = q.shape[:3]
        return q.new_empty(B, T, H, v.shape[-1]), q.new_empty(H, B * T, dtype=torch.float32)

    @torch.library.register_fake(bwd, lib=_LIB[0])
    def _(dout, q, k, v, *rest):  # type: ignore[no-untyped-def]
        # The strides the real gradients have: FA4's empty_like of the flattened inputs.
        return tuple(torch.empty_like(flat_tokens(t)).view(t.shape) for t in (q, k, v))

    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        q, k, v, source, *args = inputs
        ctx.save_for_backward(q, k, v, output[0], output[1], source)
        ctx.args = args

    def grad(ctx: Any, dout: Any, _dlse: Any) -> Any:
        q, k, v, out, lse, source = ctx.saved_tensors
        dq, dk, dv = torch.ops.fa4cache.packed_attention_backward(dout, q, k, v, out, lse, source, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None

    torch.library.register_autograd(fwd, grad, setup_context=setup_context, lib=_LIB[0])
    return torch.ops.fa4cache.packed_attention
