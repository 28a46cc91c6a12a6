"""The fused Triton metadata kernels give exactly the PyTorch path's tiles, and both agree
with brute-force tile classification (run on the CPU through Triton's interpreter, in a
subprocess because the interpreter is chosen at import).

Batch > 1, broadcast (stride-0) bounds as ``expand`` makes them, non-contiguous and
int64 bounds: every layout the entry point accepts, since a kernel that reads one
tensor with another's strides gives wrong tiles for every row but the first.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

CODE = r"""
import os, random, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from fa4cache.masks import blocksparse_triton as bt
from fa4cache.masks.blocksparse import classify_tiles
from fa4cache.masks import make_document_mask, make_draft_block_mask
from tests.masks.test_fuzz_gpu import draw_case, build_mask, check_block_lists

def flags(cnt, idx, C):
    B, R = cnt.shape
    out = torch.zeros(B, R, C, dtype=torch.bool)
    for b in range(B):
        for r in range(R):
            c = int(cnt[b, r]); v = idx[b, r, :c].long()
            assert c < 2 or bool((v[1:] > v[:-1]).all()), "indices not ascending"
            out[b, r, v] = True
    return out

class Lists:  # the fields check_block_lists reads, from bt.lists' output
    def __init__(self, r, block):
        self.mask_block_cnt, self.mask_block_idx = r[0].unsqueeze(1), r[1].unsqueeze(1)
        self.full_block_cnt, self.full_block_idx = r[2].unsqueeze(1), r[3].unsqueeze(1)
        self.block_size = block

def compare(lo, hi, T, bq, bk, what, dense=None):
    part, full = classify_tiles(lo, hi, seqlen_q=T, seqlen_k=T, block_q=bq, block_k=bk)
    r = bt.lists(lo, hi, seqlen_q=T, seqlen_k=T, block_q=bq, block_k=bk)
    M, N = part.shape[1], part.shape[2]
    assert torch.equal(flags(r[0], r[1], N), part), what
    assert torch.equal(flags(r[2], r[3], N), full), what
    assert torch.equal(flags(r[4], r[5], M), part.transpose(1, 2)), what
    assert torch.equal(flags(r[6], r[7], M), full.transpose(1, 2)), what
    if dense is not None:
        check_block_lists(None, dense, Lists(r[:4], (bq, bk)), transposed=False)
        check_block_lists(None, dense, Lists(r[4:], (bq, bk)), transposed=True)

seed = int(sys.argv[1])
rng = random.Random(seed)
blocks = [(16, 16), (32, 16), (16, 32), (64, 64), (128, 128)]
# Single rows (cu_seqlens) and draft masks.
for t in range(6):
    T = rng.randint(20, 500)
    bq, bk = rng.choice(blocks)
    if t % 3:
        n = rng.randint(1, 6); cuts = sorted(rng.sample(range(1, T), min(n - 1, T - 1)))
        m = make_document_mask(torch.tensor([0, *cuts, T]), causal=t % 2 == 0, window=rng.choice([None, 5, 50]), block_sparse=False)
    else:
        ctx = rng.randint(8, 200); K = rng.randint(1, 6)
        anchors = torch.tensor([[rng.randrange(ctx) for _ in range(K)], [rng.randrange(ctx) for _ in range(K)]])
        m = make_draft_block_mask(anchors, context_len=ctx, draft_block_size=rng.choice([4, 8, 16]), block_sparse=False)
    compare(*m.intervals, m.seqlen, bq, bk, f"single row {t}", m.dense())
# Batch > 1 from document_ids: causal bounds come out with a broadcast (stride-0) hi.
n_batched = 0
while n_batched < 6:
    case = draw_case(rng)
    if case["B"] < 2 or case.get("T", 0) > 700:
        continue
    n_batched += 1
    m = build_mask(case, dev="cpu")
    lo, hi = m.intervals
    compare(lo, hi, m.seqlen, *rng.choice(blocks), f"batched {case}", m.dense())
# Explicit layouts: broadcast either bound, transposed storage, strided rows, int64.
B, T = 3, 300
starts = torch.tensor([[0] * 100 + [100] * 200, [0] * 37 + [37] * 263, [0] * 300])
lo = starts.view(B, 1, T)
hi = (torch.arange(T) + 1).view(1, 1, T)
layouts = {
    "hi broadcast": (lo, hi.expand(B, 1, T)),
    "lo broadcast": (hi.expand(B, 1, T) - 50, lo + 120),
    "transposed storage": (lo.view(B, T).t().contiguous().t().unsqueeze(1), hi),
    "strided rows": (torch.repeat_interleave(lo, 2, dim=-1)[..., ::2], hi.expand(B, 1, T)),
    "int32": (lo.to(torch.int32), hi.to(torch.int32).expand(B, 1, T)),
}
for what, (a, b) in layouts.items():
    n = torch.arange(T).view(1, 1, 1, T)
    dense = ((n >= a.unsqueeze(-1)) & (n < b.unsqueeze(-1))).any(1)
    compare(a, b, T, 64, 32, what, dense)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [42, 7])
def test_triton_kernels_match_the_torch_path(seed: int) -> None:
    pytest.importorskip("triton")
    p = subprocess.run(
        [sys.executable, "-c", CODE, str(seed)], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, f"seed {seed}:\n{p.stderr[-3000:]}"
    assert p.stdout.strip().endswith("ok")


def test_interval_checks_name_the_argument() -> None:
    import torch

    from fa4cache.masks.intervals import check_intervals

    lo = torch.zeros(2, 1, 10, dtype=torch.int32)
    bad = [
        ((lo.float(), lo), "lo: expected an integer dtype"),
        ((lo, lo[0]), "hi: expected [batch, intervals, rows]"),
        ((lo, torch.zeros(3, 1, 10, dtype=torch.int32)), "do not broadcast"),
        ((lo[..., :5], lo[..., :5]), "fewer than seqlen_q=10"),
        ((lo, [0]), "hi: expected a tensor"),
    ]
    for args, msg in bad:
        with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            check_intervals(*args, seqlen_q=10, seqlen_k=10)
    with pytest.raises(ValueError, match="seqlen_k: expected a positive int"):
        check_intervals(lo, lo, seqlen_q=10, seqlen_k=0)
    a, b = check_intervals(lo.long() + (1 << 40), lo[:1], seqlen_q=10, seqlen_k=10)
    assert a.shape == b.shape == (2, 1, 10) and a.dtype == torch.int32 and int(a.max()) == 1 << 30
