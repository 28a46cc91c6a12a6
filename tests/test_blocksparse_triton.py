"""The fused Triton metadata kernels give exactly the PyTorch path's tiles (run on the CPU
through Triton's interpreter, in a subprocess because the interpreter is chosen at import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT

CODE = r"""
import os, random
os.environ["TRITON_INTERPRET"] = "1"
import torch
from fa4cache import blocksparse_triton as bt
from fa4cache.blocksparse import classify_tiles
from fa4cache.masks import make_document_mask, make_draft_block_mask

def flags(cnt, idx, C):
    B, R = cnt.shape
    out = torch.zeros(B, R, C, dtype=torch.bool)
    for b in range(B):
        for r in range(R):
            c = int(cnt[b, r]); v = idx[b, r, :c].long()
            assert c < 2 or bool((v[1:] > v[:-1]).all()), "indices not ascending"
            out[b, r, v] = True
    return out

rng = random.Random(42)
for t in range(10):
    T = rng.randint(20, 500)
    bq, bk = rng.choice([(16, 16), (32, 16), (16, 32), (64, 64)])
    if t % 3:
        n = rng.randint(1, 6); cuts = sorted(rng.sample(range(1, T), min(n - 1, T - 1)))
        m = make_document_mask(torch.tensor([0, *cuts, T]), causal=t % 2 == 0, window=rng.choice([None, 5, 50]), block_sparse=False)
    else:
        ctx = rng.randint(8, 200); K = rng.randint(1, 6)
        anchors = torch.tensor([[rng.randrange(ctx) for _ in range(K)], [rng.randrange(ctx) for _ in range(K)]])
        m = make_draft_block_mask(anchors, context_len=ctx, block_size=rng.choice([4, 8, 16]), block_sparse=False)
    lo, hi = m.intervals
    part, full = classify_tiles(lo, hi, seqlen_q=m.seqlen, seqlen_k=m.seqlen, block_q=bq, block_k=bk)
    r = bt.lists(lo, hi, seqlen_q=m.seqlen, seqlen_k=m.seqlen, block_q=bq, block_k=bk)
    M, N = part.shape[1], part.shape[2]
    assert torch.equal(flags(r[0], r[1], N), part), t
    assert torch.equal(flags(r[2], r[3], N), full), t
    assert torch.equal(flags(r[4], r[5], M), part.transpose(1, 2)), t
    assert torch.equal(flags(r[6], r[7], M), full.transpose(1, 2)), t
print("ok")
"""


def test_triton_kernels_match_the_torch_path() -> None:
    pytest.importorskip("triton")
    p = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("ok")
