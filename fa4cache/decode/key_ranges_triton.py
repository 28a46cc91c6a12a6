"""The Triton kernel of a decode step's key ranges (:func:`.key_ranges.key_ranges_triton`; a
module of its own: importing it imports Triton)."""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def key_ranges(
    mask, m_row, m_col, width, keys, heads_kv, cu, used, ok, n_seq, chunk,
    CHECK: tl.constexpr, BLOCK: tl.constexpr, HEADS: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    # One program per row: its first and last slot in the mask and its count of tokens.
    b = tl.program_id(0)
    count = tl.zeros([], tl.int32)
    first = tl.zeros([], tl.int32) + width
    last = tl.zeros([], tl.int32) - 1
    for c0 in range(0, width, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        x = tl.load(mask + b.to(tl.int64) * m_row + cols * m_col, mask=cols < width, other=0) != 0
        count += tl.sum(x.to(tl.int32), 0)
        first = tl.minimum(first, tl.min(tl.where(x, cols, width), 0))
        last = tl.maximum(last, tl.max(tl.where(x, cols, -1), 0))
    start = tl.where(count > 0, first, 0)
    if CHECK:
        # One run of tokens: as many as its span (an empty row is one too).
        tl.store(ok + b, ((count == 0) | (last - first + 1 == count)).to(tl.int32))
    # A mask wider than the keys (a sliding cache holds the last `keys` tokens): bounded by them.
    n = tl.where(width > keys, tl.maximum(tl.minimum(count, keys - start), 0), count)
    h = tl.arange(0, HEADS)
    seq = b * heads_kv + h
    # Split decoding (split_kv.py): the run in SPLITS chunks of `chunk` keys, chunk j of
    # every sequence at j * n_seq + seq; a chunk past the run is empty, at the run's end.
    for j in tl.static_range(SPLITS):
        lo = j * chunk
        tl.store(cu + j * n_seq + seq, seq * keys + start + tl.minimum(lo, n), mask=h < heads_kv)
        part = tl.minimum(tl.maximum(n - lo, 0), chunk)
        tl.store(used + j * n_seq + seq, tl.zeros([HEADS], tl.int32) + part, mask=h < heads_kv)
    if b == 0:
        tl.store(cu + SPLITS * n_seq, n_seq * keys)
