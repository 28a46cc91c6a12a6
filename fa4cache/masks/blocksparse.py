"""Block-sparse metadata for FA4, in closed form from per-row key intervals.

Every built-in mask is, for each query row ``m``, a union of ``K`` key intervals
``[lo[k, m], hi[k, m])``. From those we classify each (query block, key block) tile
without evaluating the mask per element:

* *touched* if some row's interval overlaps the tile (a superset test from the
  per-block min/max of the bounds), else the tile is skipped entirely;
* *full* if one interval covers the whole tile for every row of the block, in which
  case FA4 skips the ``mask_mod`` for it;
* otherwise *partial*: FA4 evaluates the ``mask_mod`` there.

Touched is conservative (never misses a visible key) and full is exact-or-less (never
claims a tile with a hidden key), so correctness never depends on tightness. It is a
handful of tensor ops on the device: no host sync, no per-element work, capturable in
a CUDA graph. The forward layout is per query block; the backward layout is its
transpose (per key block), as FA4 expects.
"""

from __future__ import annotations

from typing import Any

from fa4cache.extras import triton_runs_on
from fa4cache.masks.intervals import BIG, check_intervals


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def classify_tiles(
    lo: Any, hi: Any, *, seqlen_q: int, seqlen_k: int, block_q: int, block_k: int
) -> tuple[Any, Any]:
    """``(partial, full)`` boolean tensors of shape ``[B, M, N]``.

    ``lo``/``hi``: int tensors ``[B, K, Tq_padded]`` (rows past ``seqlen_q`` ignored).
    """
    import torch

    lo, hi = check_intervals(lo, hi, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    B, K, Tp = lo.shape
    M = _ceil_div(seqlen_q, block_q)
    N = _ceil_div(seqlen_k, block_k)
    rows = M * block_q
    dev = lo.device
    lo = lo[..., :rows]
    hi = hi[..., :rows]
    if lo.shape[-1] < rows:
        pad = rows - lo.shape[-1]
        lo = torch.nn.functional.pad(lo, (0, pad), value=0)
        hi = torch.nn.functional.pad(hi, (0, pad), value=0)
    valid = (torch.arange(rows, device=dev) < seqlen_q).view(1, 1, rows)
    nonempty = (hi > lo) & valid
    lo_b = lo.reshape(B, K, M, block_q)
    hi_b = hi.reshape(B, K, M, block_q)
    ne_b = nonempty.reshape(B, K, M, block_q)
    va_b = valid.view(1, 1, M, block_q)
    touch_lo = torch.where(ne_b, lo_b, BIG).amin(-1)
    touch_hi = torch.where(ne_b, hi_b, -BIG).amax(-1)
    full_lo = torch.where(va_b, lo_b, -BIG).amax(-1)
    full_hi = torch.where(va_b, hi_b, BIG).amin(-1)
    j = torch.arange(N, device=dev, dtype=torch.int32)
    col_lo = (j * block_k).view(1, 1, 1, N)
    col_end = ((j + 1) * block_k).view(1, 1, 1, N)
    col_hi = torch.clamp(col_end, max=seqlen_k)
    touched = ((touch_lo.unsqueeze(-1) < col_hi) & (touch_hi.unsqueeze(-1) > col_lo)).any(1)
    # A key block running past seqlen_k is never "full": FA4 must mask its tail.
    full = (
        (full_lo.unsqueeze(-1) <= col_lo) & (full_hi.unsqueeze(-1) >= col_end) & (col_end <= seqlen_k)
    ).any(1)
    full &= touched
    partial = touched & ~full
    return partial, full


def _ordered(flags: Any) -> tuple[Any, Any]:
    """Counts and left-packed ascending indices of the True entries along the last dim."""
    import torch

    flags = flags.contiguous()
    cnt = flags.sum(-1, dtype=torch.int32).contiguous()
    # Stable sort of "not flagged" puts flagged columns first, in ascending order.
    idx = torch.sort((~flags).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32).contiguous()
    return cnt, idx


def block_sparse_tensors(
    lo: Any,
    hi: Any,
    *,
    seqlen_q: int,
    seqlen_k: int,
    block_size: tuple[int, int] = (128, 128),
    bwd_block_size: tuple[int, int] | None = None,
) -> tuple[Any, Any]:
    """Forward and backward ``BlockSparseTensorsTorch`` for interval masks.

    The head dimension is 1 (broadcast): the built-in masks do not depend on the head.
    ``bwd_block_size`` (default: ``block_size``) lets the backward use finer query
    blocks (on sm90, FA4's backward tiles queries by 64).
    """
    bq, bk = block_size
    if _use_triton(lo, block_size, bwd_block_size):
        return _triton_tensors(
            lo, hi, seqlen_q, seqlen_k, tuple(block_size), tuple(bwd_block_size or block_size)
        )
    partial, full = classify_tiles(lo, hi, seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_q=bq, block_k=bk)
    fwd = _as_fa4(partial, full, (bq, bk))
    if bwd_block_size is not None and tuple(bwd_block_size) != (bq, bk):
        bq, bk = bwd_block_size
        partial, full = classify_tiles(lo, hi, seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_q=bq, block_k=bk)
    # The backward walks key blocks and lists query blocks: the transpose.
    bwd = _as_fa4(partial.transpose(1, 2), full.transpose(1, 2), (bq, bk))
    return fwd, bwd


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _use_triton(lo: Any, block_size: tuple[int, int], bwd_block_size: tuple[int, int] | None) -> bool:
    """The fused kernels run where :func:`fa4cache.extras.triton_runs_on` says, with power-of-two blocks."""
    if not triton_runs_on(lo):
        return False
    return all(_pow2(v) for v in (*block_size, *(bwd_block_size or block_size)))


def _triton_tensors(
    lo: Any, hi: Any, seqlen_q: int, seqlen_k: int, block: tuple[int, int], bwd_block: tuple[int, int]
) -> tuple[Any, Any]:
    from . import blocksparse_triton as bt

    r = bt.lists(lo, hi, seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_q=block[0], block_k=block[1])
    fwd = _pack(*r[:4], block)
    if bwd_block != block:
        r = bt.lists(lo, hi, seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_q=bwd_block[0], block_k=bwd_block[1])
    return fwd, _pack(*r[4:], bwd_block)


def _as_fa4(partial: Any, full: Any, block_size: tuple[int, int]) -> Any:
    """FA4's ``BlockSparseTensorsTorch`` from per-row flags."""
    return _pack(*_ordered(partial), *_ordered(full), block_size)


def _pack(cnt_p: Any, idx_p: Any, cnt_f: Any, idx_f: Any, block_size: tuple[int, int]) -> Any:
    """FA4's ``BlockSparseTensorsTorch`` from counts and index lists, with a broadcast head dim."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    return BlockSparseTensorsTorch(
        mask_block_cnt=cnt_p.unsqueeze(1),
        mask_block_idx=idx_p.unsqueeze(1),
        full_block_cnt=cnt_f.unsqueeze(1),
        full_block_idx=idx_f.unsqueeze(1),
        block_size=block_size,
    )
