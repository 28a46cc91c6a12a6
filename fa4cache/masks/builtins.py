"""The built-in mask templates: every built-in mask is a union of per-row key intervals.

Both templates read their geometry from aux tensors indexed by ``(batch, query row)``
and declare their intervals (:data:`~fa4cache.masks.template.ROW_INTERVALS_ATTR`) unless
``row_intervals=False`` (``FA4CACHE_INTERVAL_MASKING=0``), which is part of the
specialisation and so of the hash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fa4cache.settings import setting

from .template import ROW_INTERVALS_ATTR, mask_template


def interval_masking_enabled() -> bool:
    return bool(setting("FA4CACHE_INTERVAL_MASKING"))


@mask_template(name="fa4cache.interval")
def interval_mask(causal: bool, row_intervals: bool = True) -> Callable[..., Any]:
    """Row ``m`` sees keys in ``[lo[m], hi[m])``; with ``causal`` the upper bound is ``m``
    itself and only ``lo`` is read (one load instead of two). ``row_intervals`` also
    declares the interval to FA4's Hopper masking (one R2P mask per row instead of one
    mask_mod call per score)."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    if causal:

        @cute.jit
        def causal_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
            lo = aux_tensors[0]
            first = utils.scalar_to_ssa(lo[batch[0], m_idx[0]], cutlass.Int32)
            return (n_idx >= first) & (n_idx <= m_idx)

        @cute.jit
        def causal_rows(batch_idx, head_idx, q_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
            return ((aux_tensors[0][batch_idx, q_idx], q_idx + 1),)

        mod, rows = causal_mod, causal_rows
    else:

        @cute.jit
        def interval_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
            lo = aux_tensors[0]
            hi = aux_tensors[1]
            first = utils.scalar_to_ssa(lo[batch[0], m_idx[0]], cutlass.Int32)
            end = utils.scalar_to_ssa(hi[batch[0], m_idx[0]], cutlass.Int32)
            return (n_idx >= first) & (n_idx < end)

        @cute.jit
        def interval_rows(batch_idx, head_idx, q_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
            return ((aux_tensors[0][batch_idx, q_idx], aux_tensors[1][batch_idx, q_idx]),)

        mod, rows = interval_mod, interval_rows
    if row_intervals:
        setattr(mod, ROW_INTERVALS_ATTR, rows)
    return mod


@mask_template(name="fa4cache.draft_block")
def draft_block_mask(draft_block_size: int, row_intervals: bool = True) -> Callable[..., Any]:
    """Row ``m`` sees keys ``< ctx_end[m]`` and its own draft block ``[blk[m], blk[m] + draft_block_size)``."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def draft_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
        ctx_end = aux_tensors[0]
        blk = aux_tensors[1]
        c = utils.scalar_to_ssa(ctx_end[batch[0], m_idx[0]], cutlass.Int32)
        s = utils.scalar_to_ssa(blk[batch[0], m_idx[0]], cutlass.Int32)
        return (n_idx < c) | ((n_idx >= s) & (n_idx < s + draft_block_size))

    @cute.jit
    def draft_rows(batch_idx, head_idx, q_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
        s = aux_tensors[1][batch_idx, q_idx]
        return ((0, aux_tensors[0][batch_idx, q_idx]), (s, s + draft_block_size))

    if row_intervals:
        setattr(draft_mod, ROW_INTERVALS_ATTR, draft_rows)
    return draft_mod


@mask_template(name="fa4cache.document_prefix")
def document_prefix_mask(window: int | None = None) -> Callable[..., Any]:
    """Prefix-LM inside one varlen document: a query inside the document's prefix
    (``aux_tensors[0][document]`` tokens) sees the whole prefix; a query ``m`` after it
    sees keys ``n <= m`` (and ``n >= m - window`` with a window). Document-local
    coordinates: FA4's varlen kernels pass the document as the batch index."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    if window is None:

        @cute.jit
        def prefix_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
            plen = utils.scalar_to_ssa(aux_tensors[0][batch[0]], cutlass.Int32)
            return (n_idx <= m_idx) | (n_idx < plen)

        return prefix_mod

    @cute.jit
    def windowed_prefix_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
        plen = utils.scalar_to_ssa(aux_tensors[0][batch[0]], cutlass.Int32)
        after = (n_idx <= m_idx) & (n_idx >= m_idx - window) & (m_idx >= plen)
        return after | ((n_idx < plen) & (m_idx < plen))

    return windowed_prefix_mod
