"""fa4cache masks at every head dim in ``flash_attn_func(q, k, v, **mask)``.

A mask's block-sparse metadata is built before it sees ``q``, on the tiles of head dims up
to 128. On sm_90 FA4 needs other key tiles at 192 and 256 and rejects the metadata
("Block sparsity expects sparse_block_size[1]=96 ..."). ``install()`` wraps FA4's two
entry points so that metadata belonging to a live fa4cache mask is swapped for the mask's
:meth:`~fa4cache.AttentionMask.for_head_dim` metadata (built once per mask and tile, or
per call for a builder's mask, whose tensors change in place);
metadata from anywhere else passes through untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fa4cache.masks.mask import AttentionMask

ENTRY_POINTS = ("_flash_attn_fwd", "_flash_attn_bwd")


def fit_to_head_dim(q: Any, block_sparse_tensors: Any) -> Any:
    """``block_sparse_tensors`` (forward or backward) fitted to ``q``'s head dim if an
    fa4cache mask holds it, else unchanged."""
    mask = AttentionMask.owning(block_sparse_tensors)
    if mask is None or q is None:
        return block_sparse_tensors
    fitted = mask.for_head_dim(int(q.shape[-1]))
    if block_sparse_tensors is mask.block_sparse_tensors_bwd:
        return fitted.block_sparse_tensors_bwd
    return fitted.block_sparse_tensors


def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (FA4's ``_flash_attn_fwd`` or ``_flash_attn_bwd``; ``q`` first, the metadata
    as the ``block_sparse_tensors`` keyword, as FA4's autograd functions pass them)."""

    @functools.wraps(fn)
    def fitted(*args: Any, **kwargs: Any) -> Any:
        bst = kwargs.get("block_sparse_tensors")
        if bst is not None and args:
            kwargs["block_sparse_tensors"] = fit_to_head_dim(args[0], bst)
        return fn(*args, **kwargs)

    fitted.__fa4cache_fits_masks__ = True  # type: ignore[attr-defined]
    return fitted
