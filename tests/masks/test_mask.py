"""The mask object (fa4cache/masks/mask.py): its checks and its repr."""

from __future__ import annotations

import pytest
import torch

import fa4cache


def test_mask_check_refuses_a_head_dim_fa4_does_not_run_and_a_meta_cu_seqlens() -> None:
    import torch

    import fa4cache

    mask = fa4cache.make_document_mask(torch.tensor([0, 212, 512]), seqlen=512)
    with pytest.raises(ValueError, match=r"head_dim: FA4 supports head dims 1 to 256, got 300"):
        mask.for_head_dim(300)
    with pytest.raises(
        ValueError, match=r"^q: head_dim \(q.shape\[3\]\): FA4 supports head dims 1 to 256, got 300$"
    ):
        mask.check(torch.zeros(1, 512, 2, 300))
    mask.check(torch.zeros(1, 512, 2, 256))  # the largest FA4 runs
    with pytest.raises(ValueError, match=r"^cu_seqlens: a tensor on the meta device holds no values"):
        fa4cache.make_document_mask(torch.tensor([0, 3, 8], device="meta"))


def test_mask_repr_is_short() -> None:
    mask = fa4cache.make_document_mask(torch.tensor([0, 3000, 8192]), seqlen=8192, window=64)
    r = repr(mask)
    assert len(r) < 300, r
    assert r.startswith(
        "AttentionMask(name='document_causal_window', batch=1, seqlen=8192, aux_tensors=[int32[1, "
    )
