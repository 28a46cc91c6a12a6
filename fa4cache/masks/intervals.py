"""Row intervals, the geometry every built-in mask is made of: their bound and their checks.

A mask row attends to key intervals ``[lo, hi)``; ``BIG`` stands for "past any position"
(an open end), and every interval tensor is checked here before a kernel reads it.
"""

from __future__ import annotations

from typing import Any

# Past any sequence position, and still an int32 after adding a tile width.
BIG = 1 << 30


def check_intervals(lo: Any, hi: Any, *, seqlen_q: int, seqlen_k: int) -> tuple[Any, Any]:
    """Validate and normalise interval bounds for the tile classifiers.

    Returns ``(lo, hi)`` as int32 views of one broadcast shape ``[B, K, T]`` with
    ``T >= seqlen_q``; they may be non-contiguous or have stride-0 dims (the kernels take
    each tensor's own strides). Wider integers are clamped to ``[-BIG, BIG]`` first, which
    keeps every interval's meaning (no position reaches ``BIG``). Raises ``ValueError``
    naming the argument, so that no input layout can make a kernel read outside a tensor.
    """
    import torch

    for name, v in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name}: expected a positive int, got {v!r}")
    for name, t in (("lo", lo), ("hi", hi)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name}: expected an integer dtype, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{name}: expected [batch, intervals, rows], got shape {tuple(t.shape)}")
    if lo.device != hi.device:
        raise ValueError(f"lo is on {lo.device} but hi is on {hi.device}")
    try:
        lo, hi = torch.broadcast_tensors(lo, hi)
    except RuntimeError:
        raise ValueError(
            f"lo, hi: shapes {tuple(lo.shape)} and {tuple(hi.shape)} do not broadcast to one [batch, intervals, rows]"
        ) from None
    if lo.shape[-1] < seqlen_q:
        raise ValueError(f"lo, hi: {lo.shape[-1]} rows, fewer than seqlen_q={seqlen_q}")
    if lo.numel() == 0:
        raise ValueError(f"lo, hi: empty shape {tuple(lo.shape)}")
    if lo.dtype != torch.int32:
        lo = lo.clamp(-BIG, BIG).to(torch.int32)
    if hi.dtype != torch.int32:
        hi = hi.clamp(-BIG, BIG).to(torch.int32)
    return lo, hi
