"""Document masks: packed documents that never attend across a boundary.

Every option is a per-row key interval ``[lo, hi)`` computed with a few tensor ops on
the device (no host sync with ``validate=False``), and one compiled kernel serves every
packing: the geometry lives in aux tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fa4cache.masks.builtins import interval_mask, interval_masking_enabled
from fa4cache.masks.mask import (
    BIG,
    AttentionMask,
    as_int_tensor,
    check_flag,
    check_int32,
    check_length,
    pad_rows,
)


def _doc_bounds_from_cu(cu: Any, T: int) -> tuple[Any, Any, Any]:
    import torch

    pos = torch.arange(T, device=cu.device, dtype=cu.dtype)
    doc = torch.searchsorted(cu[1:].contiguous(), pos, right=True)
    return cu[doc].unsqueeze(0), cu[doc + 1].unsqueeze(0), doc.unsqueeze(0)


def _doc_bounds_from_ids(ids: Any) -> tuple[Any, Any, Any, Any]:
    import torch

    B, T = ids.shape
    idx = torch.arange(T, device=ids.device).expand(B, T)
    change = torch.ones(B, T, dtype=torch.bool, device=ids.device)
    change[:, 1:] = ids[:, 1:] != ids[:, :-1]
    start = torch.where(change, idx, torch.zeros_like(idx)).cummax(1).values
    is_end = torch.ones(B, T, dtype=torch.bool, device=ids.device)
    is_end[:, :-1] = change[:, 1:]
    e = torch.where(is_end, idx + 1, torch.full_like(idx, T))
    end = e.flip(1).cummin(1).values.flip(1)
    run = change.to(torch.int64).cumsum(1) - 1
    return start, end, run, change


def make_document_mask(
    cu_seqlens: Any = None,
    *,
    document_ids: Any = None,
    causal: bool = True,
    window: int | None = None,
    prefix_lengths: Any = None,
    seqlen: int | None = None,
    block_sparse: bool = True,
    sparse_tile: tuple[int, int] | None = None,
    bwd_sparse_tile: tuple[int, int] | None = None,
    max_documents: int | None = None,
    max_seqlen: int | None = None,
    validate: bool = True,
) -> AttentionMask:
    """Mask for packed documents: attention never crosses a document boundary.

    Give the packing either as ``cu_seqlens`` (``[D + 1]`` cumulative lengths of one
    packed row, starting at 0) or as ``document_ids`` (``[B, T]``, one id per token,
    documents contiguous). In ``document_ids`` a document is a run of equal ids: a new
    document starts wherever the id changes, so ``[0, 0, 1, 1, 0]`` is three documents
    (the ids need not be distinct or sorted; only changes count), and every row starts a
    new one. No id is special: ``-1`` is not padding, it is one more document (give
    padding its own id and ignore its outputs, or leave it out of ``cu_seqlens``).
    Options:

    * ``causal``: causal inside each document (default) or bidirectional;
    * ``window``: a query sees at most ``window`` earlier keys (and, if bidirectional,
      ``window`` later keys) of its document;
    * ``prefix_lengths``: per document, a bidirectional prefix (prefix-LM); shape
      ``[D]`` with ``cu_seqlens``, ``[B, max_documents]`` with ``document_ids``.

    ``sparse_tile`` / ``bwd_sparse_tile`` are FA4's block-sparse tiles (query, key) for the
    forward and the backward; by default the target arch's (:mod:`fa4cache.masks.tiles`: sm_90
    (128, 128) both ways, sm_100 (256, 128) and (128, 256)); a tile FA4 would reject is a
    ``ValueError`` naming the valid sizes. On sm90 with head_dim 65-128
    FA4's backward tiles queries by 64, so ``(64, 128)`` is valid there; it is not the
    default because it is invalid for head_dim <= 64 (query tiles of 128) and on other
    archs, and three H200 runs put it between 1% slower and 5% faster. ``seqlen`` (the
    total length) saves a device sync when given with ``cu_seqlens``.
    ``validate=False`` skips the checks that read values back from the device, for
    CUDA-graph capture.

    The mask also carries its documents as FA4 varlen sequences (``mask.varlen``), which
    :func:`fa4cache.attention` uses: ``max_seqlen`` (the longest document, if the data
    loader knows it) is passed on, never computed; ``max_documents`` bounds the number of
    documents over all rows of ``document_ids`` (FA4's varlen backward pads each one by a
    tile). Without it they are counted when validating (one sync); ``validate=False`` with
    ``document_ids`` needs it. Returns an :class:`AttentionMask`.
    """
    import torch

    seqlen = check_length(seqlen, "seqlen")
    causal = check_flag(causal, "causal")
    block_sparse = check_flag(block_sparse, "block_sparse")
    validate = check_flag(validate, "validate")
    if (cu_seqlens is None) == (document_ids is None):
        raise ValueError("make_document_mask: give exactly one of cu_seqlens or document_ids")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 0):
        raise ValueError(f"window: expected a non-negative int, got {window!r}")
    if prefix_lengths is not None and not causal:
        raise ValueError("prefix_lengths: a prefix-LM mask is causal after the prefix; use causal=True")
    if cu_seqlens is not None:
        pk = _packing_from_cu(cu_seqlens, seqlen, validate)
    else:
        pk = _packing_from_ids(document_ids, seqlen, max_documents, validate)
    if pk.total <= 0:
        raise ValueError("make_document_mask: total sequence length must be positive")
    plen, doc_prefix = _prefixes(prefix_lengths, pk, validate) if prefix_lengths is not None else (None, None)
    lo, hi = _row_intervals(pk, causal, window, plen)
    variant_causal = causal and prefix_lengths is None
    lo32 = lo.to(torch.int32).expand(pk.batch, pk.total)
    hi32 = hi.to(torch.int32).expand(pk.batch, pk.total)
    mod = interval_mask(causal=variant_causal, row_intervals=interval_masking_enabled())
    aux = [pad_rows(lo32, BIG)] if variant_causal else [pad_rows(lo32, 0), pad_rows(hi32, 0)]
    intervals = (lo32.unsqueeze(1), hi32.unsqueeze(1))
    fwd = bwd = None
    if block_sparse:
        from .blocksparse import block_sparse_tensors
        from .tiles import resolve_tiles

        tile, bwd_tile = resolve_tiles(sparse_tile, bwd_sparse_tile, pk.device)
        fwd, bwd = block_sparse_tensors(
            *intervals, seqlen_q=pk.total, seqlen_k=pk.total, block_size=tile, bwd_block_size=bwd_tile
        )
    name = (
        "document"
        + ("_causal" if causal else "")
        + ("_window" if window is not None else "")
        + ("_prefix" if prefix_lengths is not None else "")
    )
    from .varlen import layout

    varlen = layout(cu=pk.varlen_cu, causal=causal, window=window, prefix=doc_prefix, max_seqlen=max_seqlen)
    return AttentionMask(mod, aux, fwd, bwd, pk.total, pk.batch, name, intervals, varlen)


@dataclass(frozen=True)
class _Packing:
    """Where each token's document starts and ends, and the documents as varlen sequences."""

    start: Any  # [B or 1, T] first token of the token's document
    end: Any  # [B or 1, T] one past its last token
    doc: Any  # [B or 1, T] the document's index in its row
    batch: int
    total: int
    device: Any
    varlen_cu: Any  # the documents as FA4 varlen offsets (int32)
    doc_starts: Any  # each document's first token (flat index)
    documents: int | None  # the number of documents, when given as cu_seqlens


def _packing_from_cu(cu_seqlens: Any, seqlen: int | None, validate: bool) -> _Packing:
    import torch

    cu = as_int_tensor(cu_seqlens, "cu_seqlens")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(
            f"cu_seqlens: expected a 1-D tensor of at least 2 offsets, got shape {tuple(cu.shape)}"
        )
    if validate:
        check_int32(cu, "cu_seqlens")
        if int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens: must start at 0, starts at {int(cu[0])}")
        if bool((cu[1:] < cu[:-1]).any()):
            raise ValueError("cu_seqlens: offsets must be non-decreasing (sorted)")
    total = int(cu[-1]) if seqlen is None else int(seqlen)
    if validate and seqlen is not None and int(cu[-1]) != seqlen:
        raise ValueError(f"cu_seqlens: total length {int(cu[-1])} does not match seqlen={seqlen}")
    cu = cu.to(torch.int64)
    start, end, doc = _doc_bounds_from_cu(cu, total)
    return _Packing(start, end, doc, 1, total, cu.device, cu.to(torch.int32), cu[:-1], cu.numel() - 1)


def _packing_from_ids(
    document_ids: Any, seqlen: int | None, max_documents: int | None, validate: bool
) -> _Packing:
    ids = as_int_tensor(document_ids, "document_ids")
    if ids.dim() != 2:
        raise ValueError(f"document_ids: expected [batch, seqlen], got shape {tuple(ids.shape)}")
    batch, total = ids.shape
    if seqlen is not None and seqlen != total:
        raise ValueError(f"document_ids: length {total} does not match seqlen={seqlen}")
    start, end, doc, change = _doc_bounds_from_ids(ids)
    if max_documents is None:
        if not validate:
            raise ValueError(
                "max_documents: needed with document_ids and validate=False (counting the "
                "documents would read a value back from the device)"
            )
        max_documents = int(change.sum())
    if not isinstance(max_documents, int) or isinstance(max_documents, bool) or max_documents <= 0:
        raise ValueError(f"max_documents: expected a positive int, got {max_documents!r}")
    from .varlen import starts_from_change

    varlen_cu, doc_starts = starts_from_change(change, max_documents)
    return _Packing(start, end, doc, batch, total, ids.device, varlen_cu, doc_starts, None)


def _prefixes(prefix_lengths: Any, pk: _Packing, validate: bool) -> tuple[Any, Any]:
    """Each token's prefix length (``[B or 1, T]``) and each document's (for the varlen calls)."""
    import torch

    p = as_int_tensor(prefix_lengths, "prefix_lengths", device=pk.device).to(
        device=pk.device, dtype=torch.int64
    )
    if validate and bool((p < 0).any()):
        raise ValueError("prefix_lengths: must be non-negative")
    doc = pk.doc
    if pk.documents is not None:
        if p.dim() != 1 or p.numel() != pk.documents:
            raise ValueError(
                f"prefix_lengths: expected shape [{pk.documents}] (one per document), got {tuple(p.shape)}"
            )
        plen = p[doc]
        doc_prefix = p.to(torch.int32)
    else:
        if p.dim() != 2 or p.shape[0] != pk.batch:
            raise ValueError(f"prefix_lengths: expected [batch, max_documents], got {tuple(p.shape)}")
        if validate and int(doc.max()) >= p.shape[1]:
            raise ValueError(
                f"prefix_lengths: {p.shape[1]} columns but a row has {int(doc.max()) + 1} documents"
            )
        plen = torch.gather(p, 1, doc.clamp(max=p.shape[1] - 1))
        # each document's own row and index within it, at its first token
        at = pk.doc_starts.clamp(max=pk.batch * pk.total - 1)
        local = doc.reshape(-1)[at].clamp(max=p.shape[1] - 1)
        doc_prefix = p[at // pk.total, local].to(torch.int32)
    if validate:
        # A prefix past its document's end is almost always misaligned per-document
        # data (another batch's lengths, a shifted row): say so rather than clamp.
        bad = (plen > pk.end - pk.start).nonzero()
        if bad.numel():
            b, t = (int(x) for x in bad[0])
            row = f" of row {b}" if pk.batch > 1 else ""
            raise ValueError(
                f"prefix_lengths: {int(plen[b, t])} for document {int(doc[b, t])}{row}, which has "
                f"{int(pk.end[b, t] - pk.start[b, t])} tokens (a prefix is at most its document's length)"
            )
    return plen, doc_prefix


def _row_intervals(pk: _Packing, causal: bool, window: int | None, plen: Any) -> tuple[Any, Any]:
    """Each row's visible keys ``[lo, hi)``: its document, cut by causality, window and prefix."""
    import torch

    m = torch.arange(pk.total, device=pk.device, dtype=torch.int64).view(1, pk.total)
    start, end = pk.start, pk.end
    lo = start if window is None else torch.maximum(start, m - window)
    if not causal:
        return lo, (end if window is None else torch.minimum(end, m + window + 1))
    hi = m + 1
    if plen is not None:
        pend = torch.minimum(start + plen, end)
        in_prefix = m < pend
        lo = torch.where(in_prefix, start, lo)
        hi = torch.where(in_prefix, pend, hi)
    return lo, hi
