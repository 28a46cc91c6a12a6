"""The Triton kernel of :mod:`.sequence_add` (a module of its own: importing it imports Triton)."""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_ROWS = 64


@triton.jit
def add_sequences(
    dst, src, cu, used, n_rows, n_seq, dim,
    d_row, d_head, d_dim, s_row, s_head, s_dim,
    STEPS: tl.constexpr, HAS_USED: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    head = tl.program_id(1)
    # The last sequence i with cu[i] <= row (empty sequences share a start: the last wins,
    # and its length is 0 only when every sequence starting there is empty).
    lo = tl.zeros([BR], tl.int32)
    hi = tl.full([BR], 0, tl.int32) + n_seq - 1
    for _ in tl.static_range(STEPS):
        mid = (lo + hi + 1) // 2
        go_right = tl.load(cu + mid) <= rows
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid - 1)
    start = tl.load(cu + lo)
    if HAS_USED:
        length = tl.load(used + lo)
    else:
        length = tl.load(cu + lo + 1) - start
    inside = (rows >= start) & (rows < start + length) & (rows < n_rows)
    if tl.max(inside.to(tl.int32), 0) > 0:
        r = rows.to(tl.int64)[:, None]
        for d0 in tl.static_range(0, BD, 128):
            cols = d0 + tl.arange(0, 128)[None, :]
            keep = inside[:, None] & (cols < dim)
            a_ptr = dst + r * d_row + head * d_head + cols * d_dim
            b = tl.load(src + r * s_row + head * s_head + cols * s_dim, mask=keep, other=0.0)
            a = tl.load(a_ptr, mask=keep, other=0.0)
            tl.store(a_ptr, (a.to(tl.float32) + b.to(tl.float32)).to(a.dtype), mask=keep)
