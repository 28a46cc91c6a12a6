"""Masks at head dims 192 and 256: FA4 on sm_90 needs other block-sparse key tiles there
(96 and 64), which a mask built before it sees ``q`` cannot know.

Checked here: the refitted metadata against brute-force tile classification of the
boolean mask, on random packings; the refit cache and its way back to the mask as built;
the wrapper that ``install()`` puts on FA4's entry points; and real sm_90 cross-compiles
of block-sparse kernels at 192 and 256 (which FA4 rejected before). The outputs and
gradients at these head dims are checked on the GPU (tests/masks/test_fuzz_gpu.py).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli

SEED = int(os.environ["FA4CACHE_FUZZ_SEED"])


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(2))
def test_refitted_lists_match_brute_force(shard: int) -> None:
    from tests.masks.test_fuzz_gpu import build_mask, check_block_lists, draw_case

    rng = random.Random(SEED + shard)
    for i in range(12):
        case = draw_case(rng)
        if case.get("T", 0) * case["B"] > 2000:
            continue
        mask = build_mask(case, dev="cpu")
        dense = mask.dense()
        for head_dim, key in ((64, 128), (128, 128), (192, 96), (256, 64)):
            fitted = mask.for_head_dim(head_dim)
            where = f"FA4CACHE_FUZZ_SEED={SEED} shard {shard} case {i} head_dim {head_dim}: {case}"
            assert fitted.block_sparse_tensors.block_size == (128, key), where
            assert fitted.block_sparse_tensors_bwd.block_size == (128, key), where
            assert (fitted is mask) == (key == 128), where
            check_block_lists(fitted, dense, fitted.block_sparse_tensors, transposed=False)
            check_block_lists(fitted, dense, fitted.block_sparse_tensors_bwd, transposed=True)


def test_refits_are_cached_and_lead_back_to_the_mask_as_built() -> None:
    import torch

    from fa4cache.masks import make_document_mask

    mask = make_document_mask(torch.tensor([0, 300, 301, 1000]), window=77)
    wide = mask.for_head_dim(192)
    assert mask.for_head_dim(192) is wide  # a model's layers share one refit
    assert wide.for_head_dim(128) is mask and wide.for_head_dim(256) is mask.for_head_dim(256)
    assert wide.for_head_dim(192) is wide
    # Everything but the metadata is the mask's own.
    assert wide.aux_tensors is mask.aux_tensors and wide.varlen is mask.varlen
    plain = make_document_mask(torch.tensor([0, 10]), block_sparse=False)
    assert plain.for_head_dim(256) is plain  # no block-sparse metadata: nothing to refit
    with pytest.raises(ValueError, match="head_dim: expected a positive int"):
        mask.for_head_dim(0)


def test_a_builders_mask_is_refitted_from_its_current_contents() -> None:
    # DocumentMaskBuilder returns the same mask object on every call, its tensors rewritten
    # in place by a graph replay: a cached refit would keep the first packing's tiles.
    import dataclasses

    import torch

    from fa4cache.masks import make_document_mask
    from tests.masks.test_fuzz_gpu import check_block_lists

    T = 900
    first = make_document_mask(torch.tensor([0, 100, 101, 700, T]), seqlen=T, window=50)
    second = make_document_mask(torch.tensor([0, 450, T]), seqlen=T, window=50)
    live = dataclasses.replace(first, rewritten_in_place=True)
    before = live.for_head_dim(192)
    check_block_lists(before, first.dense(), before.block_sparse_tensors, transposed=False)
    for mine, new in zip(first.intervals, second.intervals):
        mine.copy_(new)  # what the builder's replay does
    after = live.for_head_dim(192)
    assert after is not before
    check_block_lists(after, second.dense(), after.block_sparse_tensors, transposed=False)
    check_block_lists(after, second.dense(), after.block_sparse_tensors_bwd, transposed=True)


def test_entry_point_wrapper_swaps_only_a_live_masks_metadata() -> None:
    import torch
    from fa4cache.adapters.fa4.mask_tiles import wrap

    from fa4cache.masks import make_draft_block_mask
    from fa4cache.masks.blocksparse import block_sparse_tensors

    seen: list[Any] = []

    def entry(q: Any, k: Any, v: Any, *rest: Any, **kwargs: Any) -> str:
        seen.append(kwargs.get("block_sparse_tensors"))
        return "out"

    fitted_entry = wrap(entry)
    mask = make_draft_block_mask(torch.tensor([[3, 40]]), context_len=200, draft_block_size=16)
    foreign, _ = block_sparse_tensors(*mask.intervals, seqlen_q=mask.seqlen, seqlen_k=mask.seqlen)

    def call(head_dim: int, bst: Any) -> Any:
        q = torch.empty(1, mask.seqlen, 2, head_dim)
        assert fitted_entry(q, q, q, block_sparse_tensors=bst) == "out"
        return seen[-1]

    assert call(192, mask.block_sparse_tensors) is mask.for_head_dim(192).block_sparse_tensors
    assert call(256, mask.block_sparse_tensors_bwd) is mask.for_head_dim(256).block_sparse_tensors_bwd
    assert call(128, mask.block_sparse_tensors) is mask.block_sparse_tensors
    assert call(192, foreign) is foreign  # not a mask's: FA4 decides
    fitted_entry(None, None, None)  # no metadata: passed through
    assert seen[-1] is None


def test_install_wraps_the_forward_and_backward_entry_points(tmp_path: Path) -> None:
    from flash_attn.cute import interface as fi

    import fa4cache

    fa4cache.install(tmp_path / "store")
    try:
        for name in ("_flash_attn_fwd", "_flash_attn_bwd"):
            assert getattr(getattr(fi, name), "__fa4cache_fits_masks__", False), name
    finally:
        fa4cache.uninstall()
    for name in ("_flash_attn_fwd", "_flash_attn_bwd"):
        assert not hasattr(getattr(fi, name), "__fa4cache_fits_masks__"), name


@pytest.mark.compile
def test_block_sparse_kernels_cross_compile_at_head_dims_192_and_256(tmp_path: Path) -> None:
    # FA4 refused the default metadata here ("Block sparsity requires sparse_block_size[1]
    # to be a multiple of tile_n=112"); a draft-block mask always runs block-sparse.
    p = run_cli(
        tmp_path / "store", "warm", "--arch", "sm_90", "--mask", "draft_block",
        "--head-dim", "192", "--head-dim", "256", "--seqlen", "512",
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert "2 specs, 8 kernels compiled (" in p.stdout and ", 0 failed" in p.stdout, p.stdout


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((1, 12, 6, 64), (1, 12, 4, 64), (1, 12, 4, 64)), "q: 6 query heads are not a multiple of k/v's 4"),
        (((1, 12, 4, 64), (1, 12, 4, 128), (1, 12, 4, 64)), "k: head dim 128 differs from q's 64"),
        (((1, 12, 4, 64), (1, 12, 2, 64), (1, 12, 4, 64)), "v: 4 heads, k has 2"),
        (((1, 12, 4, 64), (1, 11, 4, 64), (1, 12, 4, 64)), "k: shape (1, 11, 4, 64) does not match q's"),
    ],
)
def test_attention_names_the_tensor_fa4_would_reject_without_a_message(
    shapes: tuple[tuple[int, ...], ...], message: str
) -> None:
    # FA4 checks these with assertions, those on k's head dim and v's heads without a message.
    import torch

    import fa4cache
    from fa4cache.masks import make_document_mask

    mask = make_document_mask(torch.tensor([0, 5, 12]))
    q, k, v = (torch.zeros(s, dtype=torch.bfloat16) for s in shapes)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fa4cache.attention(q, k, v, mask)


@pytest.mark.parametrize("softcap", [-1.0, float("nan"), float("inf"), "5", True])
def test_attention_names_a_bad_softcap(softcap: Any) -> None:
    import torch

    import fa4cache
    from fa4cache.masks import make_document_mask

    mask = make_document_mask(torch.tensor([0, 5, 12]))
    q = torch.zeros(1, 12, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="softcap: expected a positive number"):
        fa4cache.attention(q, q, q, mask, softcap=softcap)
