"""The document mask of one packed forward step, built once and shared by every layer.

A step's documents come from one of three tensors: ``cu_seqlens`` (offsets over the
flattened batch), a 2-D padding mask, or ``position_ids`` that restart at each document.
Every layer of the step asks for the same mask; it is built on the first request and
cached on the source tensor's storage, layout and version (so a new packing, or the same
buffer rewritten in place, builds a new one).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

SOURCES = ("cu_seqlens", "padding", "position_ids")
_GAP = (
    "fa4cache: a padding attention_mask must be one run of tokens per row (padding at either end, "
    "no gap inside); for masks with gaps use attn_implementation='sdpa'"
)

_lock = threading.Lock()
_max_documents: list[int | None] = [None]
# The step's masks: key -> (weak reference to the source tensor, mask).
_cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def set_max_documents(limit: int | None) -> None:
    """An upper bound on the documents of one step from ``position_ids``: with it the mask
    needs no host sync (what CUDA-graph capture needs); more documents than that raise on
    the device rather than merge."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise ValueError(f"max_documents: expected a positive int, got {limit!r}")
    _max_documents[0] = limit


def _key_of(t: Any) -> tuple[Any, ...]:
    # Storage, layout and version rather than id(): under torch.compile the tensor a layer
    # (or the backward) sees may be another Python object over the same memory. A hit also
    # needs the tensor the mask was built from to be alive (a weak reference): its memory
    # cannot have been reused, so equal keys mean equal data.
    try:
        ptr = t.data_ptr()
    except RuntimeError:  # fake tensors have no storage
        ptr = ("id", id(t))
    return (ptr, str(t.device), tuple(t.shape), tuple(t.stride()), t._version)


def is_capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def step_mask(
    *,
    batch: int,
    seqlen: int,
    causal: bool,
    window: int | None,
    cu_seqlens: Any = None,
    max_seqlen: int | None = None,
    position_ids: Any = None,
    padding: Any = None,
) -> Any:
    """The document mask of one forward step (the first of ``cu_seqlens``, ``padding``,
    ``position_ids`` that is given says where the documents are)."""
    import torch

    src = cu_seqlens if cu_seqlens is not None else (padding if padding is not None else position_ids)
    if src is None:
        raise ValueError("step_mask: no position_ids, cu_seqlens or padding mask to find documents in")
    # A mask built outside a CUDA-graph capture must not be reused inside one: the graph
    # would replay with that mask's buffers, never recomputing them for a new packing.
    capturing = is_capturing()
    if src.is_inference():  # no version counter (inference_mode): a change in place could not be seen
        return _build(batch, seqlen, causal, window, cu_seqlens, max_seqlen, position_ids, padding, capturing)
    # A mask built under inference_mode serves only calls under it: autograd may not save
    # its tensors for a training step's backward.
    inference = torch.is_inference_mode_enabled()
    key = (_key_of(src), batch, seqlen, causal, window, max_seqlen, _max_documents[0], capturing, inference)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0]() is not None:
            return hit[1]
    mask = _build(batch, seqlen, causal, window, cu_seqlens, max_seqlen, position_ids, padding, capturing)
    with _lock:
        if len(_cache) > 8:  # a step uses one or two (full and sliding layers)
            _cache.clear()
        _cache[key] = (weakref.ref(src), mask)
    return mask


def _build(
    batch: int,
    seqlen: int,
    causal: bool,
    window: int | None,
    cu: Any,
    max_seqlen: int | None,
    position_ids: Any,
    padding: Any,
    capturing: bool,
) -> Any:
    import torch

    from fa4cache.masks import make_document_mask

    opts: dict[str, Any] = {
        "causal": causal,
        "window": window,
        "block_sparse": False,
        "max_seqlen": max_seqlen,
    }
    if cu is not None:
        cu = cu.reshape(-1)
        if batch == 1:
            return make_document_mask(cu, seqlen=seqlen, validate=False, **opts)
        # Offsets over the flattened batch: each row also starts a document.
        pos = torch.arange(batch * seqlen, device=cu.device)
        ids = torch.searchsorted(cu[1:].contiguous(), pos, right=True).view(batch, seqlen)
        return make_document_mask(
            document_ids=ids, validate=False, max_documents=cu.numel() - 1 + batch, **opts
        )
    if padding is not None:
        # Padding is a document of its own at either end: text never sees it. A gap inside a
        # row would make two documents of its tokens, where transformers hides only the gap:
        # refused on the device (finding it on the host would be a sync in every step).
        m = padding.to(torch.bool)
        runs = (m[:, 1:] & ~m[:, :-1]).sum(1) + m[:, 0]
        torch._assert_async((runs <= 1).all(), _GAP)
        ids = padding.to(torch.int64).diff(dim=1, prepend=padding[:, :1].to(torch.int64)).ne(0).cumsum(1)
        return make_document_mask(document_ids=ids, validate=False, max_documents=3 * batch, **opts)
    pid = position_ids.expand(batch, seqlen)
    starts = torch.ones_like(pid, dtype=torch.bool)
    starts[:, 1:] = pid[:, 1:] != pid[:, :-1] + 1
    ids = starts.cumsum(1)
    limit = _max_documents[0]
    if limit is None:
        if capturing:
            raise ValueError(
                "fa4cache attention: CUDA-graph capture with documents from position_ids needs "
                "fa4cache.adapters.transformers.register(max_documents=N), or cu_seq_lens_q in the batch "
                "(DataCollatorWithFlattening(return_flash_attn_kwargs=True))"
            )
        limit = int(starts.sum())  # one sync per step: the mask is shared by every layer
    return make_document_mask(document_ids=ids, validate=False, max_documents=limit, **opts)
