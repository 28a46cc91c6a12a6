"""The anchored draft-block mask of speculative-decoding draft training."""

from __future__ import annotations

from typing import Any

from fa4cache.masks.builtins import draft_block_mask, interval_masking_enabled
from fa4cache.masks.mask import BIG, AttentionMask, as_int_tensor, check_flag, pad_rows


def make_draft_block_mask(
    anchors: Any,
    *,
    context_len: int,
    draft_block_size: int,
    block_sparse: bool = True,
    sparse_tile: tuple[int, int] | None = None,
    bwd_sparse_tile: tuple[int, int] | None = None,
    validate: bool = True,
) -> AttentionMask:
    """Anchored draft-block mask for speculative-decoding draft training.

    Each row is ``context_len`` context tokens followed by ``K`` draft blocks of
    ``draft_block_size`` tokens. Context tokens attend causally. The queries of draft
    block ``j`` see the context up to and including ``anchors[b, j]`` and their whole own
    block (bidirectionally). ``draft_block_size`` is a specialisation (compiled in);
    ``context_len`` and ``anchors`` are geometry (aux tensors): changing them never
    recompiles. ``anchors``: integer tensor ``[B, K]`` with ``0 <= anchor < context_len``.
    """
    import torch

    block_sparse = check_flag(block_sparse, "block_sparse")
    validate = check_flag(validate, "validate")
    if not isinstance(draft_block_size, int) or isinstance(draft_block_size, bool) or draft_block_size <= 0:
        raise ValueError(f"draft_block_size: expected a positive int, got {draft_block_size!r}")
    block_size = draft_block_size
    if not isinstance(context_len, int) or isinstance(context_len, bool) or context_len < 0:
        raise ValueError(f"context_len: expected a non-negative int, got {context_len!r}")
    a = as_int_tensor(anchors, "anchors")
    if a.dim() != 2:
        raise ValueError(f"anchors: expected [batch, num_blocks], got shape {tuple(a.shape)}")
    if validate and a.numel() and (int(a.min()) < 0 or int(a.max()) >= context_len):
        raise ValueError(f"anchors: every anchor must lie in the context, 0 <= anchor < {context_len}")
    B, K = a.shape
    T = context_len + K * block_size
    dev = a.device
    m = torch.arange(T, device=dev, dtype=torch.int64).view(1, T).expand(B, T)
    in_ctx = m < context_len
    blk_idx = ((m - context_len).clamp(min=0) // block_size).clamp(max=max(K - 1, 0))
    anchor_of_row = torch.gather(a.to(torch.int64), 1, blk_idx) if K else torch.zeros_like(m)
    ctx_end = torch.where(in_ctx, m + 1, anchor_of_row + 1)
    blk_start = torch.where(in_ctx, torch.full_like(m, BIG), context_len + blk_idx * block_size)
    ctx32, blk32 = ctx_end.to(torch.int32), blk_start.to(torch.int32)
    aux = [pad_rows(ctx32, 0), pad_rows(blk32, BIG)]
    zeros = torch.zeros_like(ctx32)
    blk_hi = torch.where(in_ctx, zeros, (blk_start + block_size).to(torch.int32))
    blk_lo = torch.where(in_ctx, zeros, blk32)
    intervals = (torch.stack([zeros, blk_lo], 1), torch.stack([ctx32, blk_hi], 1))
    fwd = bwd = None
    if block_sparse:
        from .blocksparse import block_sparse_tensors
        from .tiles import resolve_tiles

        tile, bwd_tile = resolve_tiles(sparse_tile, bwd_sparse_tile, dev)
        fwd, bwd = block_sparse_tensors(
            *intervals, seqlen_q=T, seqlen_k=T, block_size=tile, bwd_block_size=bwd_tile
        )
    return AttentionMask(
        draft_block_mask(draft_block_size=block_size, row_intervals=interval_masking_enabled()),
        aux,
        fwd,
        bwd,
        T,
        B,
        "draft_block",
        intervals,
    )
