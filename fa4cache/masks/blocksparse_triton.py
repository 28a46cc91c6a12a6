"""The closed-form tile classification of :mod:`fa4cache.masks.blocksparse`, fused into three
Triton kernels: per-block bounds, then the forward and backward index lists.

Same result as the PyTorch path (tests compare them, on the CPU through Triton's
interpreter), in a handful of launches instead of several dozen small ones: the launch
count, not the arithmetic, is what the metadata build costs.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from fa4cache.masks.intervals import BIG as _BIG
from fa4cache.masks.intervals import check_intervals

BIG = tl.constexpr(_BIG)  # a global read inside kernels must be a constexpr


@triton.jit
def _block_bounds(
    lo_ptr, hi_ptr, lo_sb, lo_sk, lo_st, hi_sb, hi_sk, hi_st, stats_ptr, seqlen_q, M,
    K: tl.constexpr, BQ: tl.constexpr,
):  # fmt: skip
    # One program per (batch, query block): min/max of each interval's bounds over its rows.
    b = tl.program_id(0)
    i = tl.program_id(1)
    rows = i * BQ + tl.arange(0, BQ)
    valid = rows < seqlen_q
    for k in tl.static_range(K):
        # Each tensor with its own strides: a broadcast (stride-0) batch dim is common.
        lo = tl.load(lo_ptr + b * lo_sb + k * lo_sk + rows * lo_st, mask=valid, other=0)
        hi = tl.load(hi_ptr + b * hi_sb + k * hi_sk + rows * hi_st, mask=valid, other=0)
        nonempty = (hi > lo) & valid
        out = stats_ptr + ((b * K + k) * M + i) * 4
        tl.store(out + 0, tl.min(tl.where(nonempty, lo, BIG), 0))
        tl.store(out + 1, tl.max(tl.where(nonempty, hi, -BIG), 0))
        tl.store(out + 2, tl.max(tl.where(valid, lo, -BIG), 0))
        tl.store(out + 3, tl.min(tl.where(valid, hi, BIG), 0))


@triton.jit
def _classify(stats_ptr, b, i, col_lo, seqlen_k, M, inb, K: tl.constexpr, BK: tl.constexpr):
    # Partial / full flags of tiles (query block i, key block starting at col_lo); one of
    # i and col_lo is a vector of CHUNK blocks, the other is broadcast to it.
    col_end = col_lo + BK
    col_hi = tl.minimum(col_end, seqlen_k)
    touched = tl.zeros_like(inb)
    full = tl.zeros_like(inb)
    for k in tl.static_range(K):
        s = stats_ptr + ((b * K + k) * M + i) * 4
        t_lo = tl.load(s + 0, mask=inb, other=BIG)
        t_hi = tl.load(s + 1, mask=inb, other=-BIG)
        f_lo = tl.load(s + 2, mask=inb, other=BIG)
        f_hi = tl.load(s + 3, mask=inb, other=-BIG)
        touched = touched | ((t_lo < col_hi) & (t_hi > col_lo))
        full = full | ((f_lo <= col_lo) & (f_hi >= col_end) & (col_end <= seqlen_k))
    full = full & touched & inb
    partial = touched & (~full) & inb
    return partial, full


@triton.jit
def _append(idx_p, idx_f, n_p, n_f, partial, full, values):
    # Left-pack this chunk's partial and full block indices after the n_p / n_f already
    # written; returns the new counts.
    pp = partial.to(tl.int32)
    pf = full.to(tl.int32)
    tl.store(idx_p + n_p + tl.cumsum(pp, 0) - 1, values, mask=partial)
    tl.store(idx_f + n_f + tl.cumsum(pf, 0) - 1, values, mask=full)
    return n_p + tl.sum(pp, 0), n_f + tl.sum(pf, 0)


@triton.jit
def _fwd_lists(
    stats_ptr, seqlen_k, M, N, cnt_p, idx_p, cnt_f, idx_f,
    K: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    # One program per (batch, query block): which key blocks are partial / full.
    b = tl.program_id(0)
    i = tl.program_id(1)
    row = b * M + i
    rows = i + tl.zeros([CHUNK], dtype=tl.int32)
    n_p = 0
    n_f = 0
    for start in range(0, N, CHUNK):
        j = start + tl.arange(0, CHUNK)
        inb = j < N
        partial, full = _classify(stats_ptr, b, rows, j * BK, seqlen_k, M, inb, K, BK)
        n_p, n_f = _append(idx_p + row * N, idx_f + row * N, n_p, n_f, partial, full, j)
    tl.store(cnt_p + row, n_p)
    tl.store(cnt_f + row, n_f)


@triton.jit
def _bwd_lists(
    stats_ptr, seqlen_k, M, N, cnt_p, idx_p, cnt_f, idx_f,
    K: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    # One program per (batch, key block): which query blocks are partial / full (the transpose).
    b = tl.program_id(0)
    j = tl.program_id(1)
    row = b * N + j
    n_p = 0
    n_f = 0
    for start in range(0, M, CHUNK):
        i = start + tl.arange(0, CHUNK)
        inb = i < M
        partial, full = _classify(stats_ptr, b, i, j * BK, seqlen_k, M, inb, K, BK)
        n_p, n_f = _append(idx_p + row * M, idx_f + row * M, n_p, n_f, partial, full, i)
    tl.store(cnt_p + row, n_p)
    tl.store(cnt_f + row, n_f)


def lists(lo: Any, hi: Any, *, seqlen_q: int, seqlen_k: int, block_q: int, block_k: int) -> tuple[Any, ...]:
    """``(fwd_cnt_p, fwd_idx_p, fwd_cnt_f, fwd_idx_f, bwd_cnt_p, bwd_idx_p, bwd_cnt_f, bwd_idx_f)``,
    counts ``[B, R]`` and left-packed ascending indices ``[B, R, C]`` (int32); index slots
    past a row's count hold 0."""
    import torch

    lo, hi = check_intervals(lo, hi, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    B, K, _ = lo.shape
    M = -(-seqlen_q // block_q)
    N = -(-seqlen_k // block_k)
    dev = lo.device
    stats = torch.empty(B, K, M, 4, dtype=torch.int32, device=dev)
    _block_bounds[(B, M)](lo, hi, *lo.stride(), *hi.stride(), stats, seqlen_q, M, K=K, BQ=block_q)
    out = []
    for rows, cols, kern in ((M, N, _fwd_lists), (N, M, _bwd_lists)):
        cnt_p = torch.empty(B, rows, dtype=torch.int32, device=dev)
        cnt_f = torch.empty(B, rows, dtype=torch.int32, device=dev)
        idx_p = torch.zeros(B, rows, cols, dtype=torch.int32, device=dev)
        idx_f = torch.zeros(B, rows, cols, dtype=torch.int32, device=dev)
        chunk = min(1024, triton.next_power_of_2(max(cols, 16)))
        kern[(B, rows)](stats, seqlen_k, M, N, cnt_p, idx_p, cnt_f, idx_f, K=K, BK=block_k, CHUNK=chunk)
        out += [cnt_p, idx_p, cnt_f, idx_f]
    return tuple(out)
