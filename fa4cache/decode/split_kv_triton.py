"""The Triton kernel of split decoding's combine (:func:`.split_kv.combine`; a module of
its own: importing it imports Triton)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def combine(parts, lse, out, rows, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr):
    # One program per (sequence, query head) row: its S chunks, chunk-major in parts and lse.
    r = tl.program_id(0)
    s = tl.arange(0, BS)
    d = tl.arange(0, BD)
    at = s.to(tl.int64) * rows + r
    x = tl.load(lse + at, mask=s < S, other=float("-inf"))
    top = tl.max(x, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no keys in any chunk: every weight 0
    w = tl.exp(x - top)
    total = tl.sum(w, 0)
    o = tl.load(parts + at[:, None] * D + d[None, :], mask=(s < S)[:, None] & (d < D)[None, :], other=0.0).to(
        tl.float32
    )
    acc = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out + r.to(tl.int64) * D + d, acc.to(out.dtype.element_ty), mask=d < D)
