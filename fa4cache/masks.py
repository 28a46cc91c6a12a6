"""Mask modifiers with stable hashes whose geometry lives in runtime aux tensors.

FA4 keys its compile cache on a hash of the ``mask_mod``: its source plus ``repr()`` of
the values it captures. A mask that captures sequence lengths or document boundaries
therefore compiles again for every batch layout, and one that captures a nested helper
compiles again in every process (the helper's repr holds a memory address).

Here a mask is a *template*: a factory whose arguments are the few specialisations
that really change the generated code (``causal``, a draft ``block_size``), and whose
``mask_mod`` reads all geometry from aux tensors indexed by the query row. The
``mask_mod`` carries ``__cute_hash__``, computed from the source of the factory and
everything it calls plus the specialisation values, so FA4 compiles one kernel per
specialisation, in every process, for every geometry.

Every built-in mask is a union of per-row key intervals, which gives block-sparse
metadata in closed form (:mod:`fa4cache.blocksparse`) and lets FA4's Hopper kernels mask
partial tiles per row with R2P bit masks instead of one ``mask_mod`` call per score
(:mod:`fa4cache.adapters.fa4_interval_masking`; ``FA4CACHE_INTERVAL_MASKING=0`` turns that
off, as another specialisation with its own hash).
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fa4cache.adapters.fa4_interval_masking import ROW_INTERVALS_ATTR
from fa4cache.adapters.fa4_interval_masking import enable as enable_interval_masking

from .errors import ConfigError
from .hashing import encode_key, source_digest
from .settings import ENV_INTERVAL_MASKING

# Aux tensors are padded to this many rows past the sequence end: kernels may
# evaluate the mask for out-of-range rows of the last tile before discarding them.
ROW_PAD = 256
BIG = 1 << 30
# ENV_INTERVAL_MASKING="0" keeps FA4's element-wise mask_mod path for the built-in masks
# (see fa4cache.adapters.fa4_interval_masking); part of the masks' specialisation.


def interval_masking_enabled() -> bool:
    return os.environ.get(ENV_INTERVAL_MASKING, "1").strip().lower() not in ("0", "false", "no", "off")


class MaskTemplate:
    """A geometry-free mask factory; calling it with specialisations gives a ``mask_mod``.

    The same specialisation always returns the same ``mask_mod`` object, whose
    ``__cute_hash__`` is identical across processes and ``PYTHONHASHSEED`` values and
    differs whenever the generated code can differ (other source, other specialisation).
    """

    def __init__(self, factory: Callable[..., Callable[..., Any]], name: str | None = None) -> None:
        self.factory = factory
        self.name = name or factory.__name__
        self._mods: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._source: str | None = None
        # Bound on every mask build (a per-step call): computed once here.
        self._signature = inspect.signature(factory)
        functools.update_wrapper(self, factory)

    def _normalise(self, spec: dict[str, Any]) -> dict[str, Any]:
        # Defaults are filled in, so that f(causal=True) and f(causal=True, x=<default>)
        # are the same specialisation (same object, same hash).
        try:
            bound = self._signature.bind(**spec)
        except TypeError as e:
            raise ConfigError(f"mask template {self.name}: {e}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def spec_text(self, **spec: Any) -> str:
        spec = self._normalise(spec)
        try:
            return encode_key(tuple(sorted(spec.items())))
        except Exception as e:
            raise ConfigError(
                f"mask template {self.name}: specialisation values must be plain constants "
                f"(int, float, bool, str, None, tuples of them): {e}"
            ) from None

    def hash_for(self, **spec: Any) -> str:
        if self._source is None:
            self._source = source_digest(self.factory)
        import hashlib

        return hashlib.sha256(f"{self._source}\0{self.name}\0{self.spec_text(**spec)}".encode()).hexdigest()

    def __call__(self, **spec: Any) -> Callable[..., Any]:
        text = self.spec_text(**spec)
        mod = self._mods.get(text)
        if mod is not None:
            return mod
        with self._lock:
            mod = self._mods.get(text)
            if mod is None:
                mod = self.factory(**spec)
                mod.__cute_hash__ = self.hash_for(**spec)  # type: ignore[attr-defined]
                mod.__fa4cache_mask__ = {"template": self.name, "spec": self._normalise(spec)}  # type: ignore[attr-defined]
                self._mods[text] = mod
        return mod


def mask_template(factory: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator turning a mask factory into a :class:`MaskTemplate`.

    Example::

        @fa4cache.mask_template
        def banded(width: int):
            @cute.jit
            def mask_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
                start = aux_tensors[0]                 # geometry: per-row tensor
                s = utils.scalar_to_ssa(start[batch[0], m_idx[0]], cutlass.Int32)
                return (n_idx >= s) & (n_idx < s + width)   # width: a specialisation
            return mask_mod

        mask_mod = banded(width=64)                     # same object, same hash, every time
    """
    if factory is None:
        return lambda f: MaskTemplate(f, name)
    return MaskTemplate(factory, name)


# ----------------------------------------------------------------------------- built-in templates


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
    if row_intervals and enable_interval_masking():
        setattr(mod, ROW_INTERVALS_ATTR, rows)
    return mod


@mask_template(name="fa4cache.draft_block")
def draft_block_mask(block_size: int, row_intervals: bool = True) -> Callable[..., Any]:
    """Row ``m`` sees keys ``< ctx_end[m]`` and its own draft block ``[blk[m], blk[m] + block_size)``."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def draft_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
        ctx_end = aux_tensors[0]
        blk = aux_tensors[1]
        c = utils.scalar_to_ssa(ctx_end[batch[0], m_idx[0]], cutlass.Int32)
        s = utils.scalar_to_ssa(blk[batch[0], m_idx[0]], cutlass.Int32)
        return (n_idx < c) | ((n_idx >= s) & (n_idx < s + block_size))

    @cute.jit
    def draft_rows(batch_idx, head_idx, q_idx, seqlen_info, aux_tensors):  # type: ignore[no-untyped-def]
        s = aux_tensors[1][batch_idx, q_idx]
        return ((0, aux_tensors[0][batch_idx, q_idx]), (s, s + block_size))

    if row_intervals and enable_interval_masking():
        setattr(draft_mod, ROW_INTERVALS_ATTR, draft_rows)
    return draft_mod


# ----------------------------------------------------------------------------- the mask object

_KEYS = ("mask_mod", "aux_tensors", "block_sparse_tensors", "block_sparse_tensors_bwd")


@dataclass(frozen=True)
class AttentionMask(Mapping[str, Any]):
    """Keyword arguments for ``flash_attn_func``: ``flash_attn_func(q, k, v, **mask)``.

    ``intervals`` holds the per-row key intervals ``(lo, hi)``, each ``[B, K, T]``, that
    define the mask; :meth:`dense` expands them into a boolean reference.
    """

    mask_mod: Callable[..., Any]
    aux_tensors: list[Any]
    block_sparse_tensors: Any
    block_sparse_tensors_bwd: Any
    seqlen: int
    batch: int
    name: str
    intervals: tuple[Any, Any] = field(repr=False)

    def __getitem__(self, key: str) -> Any:
        if key not in _KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_KEYS)

    def __len__(self) -> int:
        return len(_KEYS)

    def dense(self) -> Any:
        """Boolean ``[B, T, T]`` tensor: ``True`` where query row may attend to key column."""
        import torch

        lo, hi = self.intervals
        T = self.seqlen
        n = torch.arange(T, device=lo.device).view(1, 1, 1, T)
        lo_ = lo[..., :T].unsqueeze(-1)
        hi_ = hi[..., :T].unsqueeze(-1)
        return ((n >= lo_) & (n < hi_)).any(1)

    def check(self, q: Any) -> None:
        """Raise ``ValueError`` if this mask does not fit ``q`` (``[B, T, H, D]``)."""
        if q.dim() != 4:
            raise ValueError(f"q: expected [batch, seqlen, heads, head_dim], got shape {tuple(q.shape)}")
        if q.shape[0] != self.batch or q.shape[1] != self.seqlen:
            raise ValueError(
                f"q: shape {tuple(q.shape)} does not match the mask's batch={self.batch}, "
                f"seqlen={self.seqlen} (total length of the packed documents)"
            )
        dev = self.aux_tensors[0].device
        if q.device != dev:
            raise ValueError(
                f"q is on {q.device} but the mask's tensors are on {dev}: build the mask on q's device"
            )


# ----------------------------------------------------------------------------- geometry


def _as_int_tensor(x: Any, name: str, device: Any = None) -> Any:
    import torch

    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, device=device)
        except Exception as e:
            raise ValueError(f"{name}: expected an integer tensor or sequence, got {type(x).__name__}") from e
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name}: expected an integer dtype, got {x.dtype}")
    return x


def _check_int32(x: Any, name: str) -> None:
    if x.numel() and (int(x.max()) >= 2**31 or int(x.min()) < -(2**31)):
        raise ValueError(f"{name}: values do not fit in int32")


def _pad_rows(t: Any, value: int) -> Any:
    import torch

    return torch.nn.functional.pad(t, (0, ROW_PAD), value=value).contiguous()


def _doc_bounds_from_cu(cu: Any, T: int) -> tuple[Any, Any, Any]:
    import torch

    pos = torch.arange(T, device=cu.device, dtype=cu.dtype)
    doc = torch.searchsorted(cu[1:].contiguous(), pos, right=True)
    return cu[doc].unsqueeze(0), cu[doc + 1].unsqueeze(0), doc.unsqueeze(0)


def _doc_bounds_from_ids(ids: Any) -> tuple[Any, Any, Any]:
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
    return start, end, run


def make_document_mask(
    cu_seqlens: Any = None,
    *,
    document_ids: Any = None,
    causal: bool = True,
    window: int | None = None,
    prefix_lengths: Any = None,
    seqlen: int | None = None,
    block_sparse: bool = True,
    block_size: tuple[int, int] = (128, 128),
    bwd_block_size: tuple[int, int] | None = None,
    validate: bool = True,
) -> AttentionMask:
    """Mask for packed documents: attention never crosses a document boundary.

    Give the packing either as ``cu_seqlens`` (``[D + 1]`` cumulative lengths of one
    packed row, starting at 0) or as ``document_ids`` (``[B, T]``, one id per token,
    documents contiguous). Options:

    * ``causal``: causal inside each document (default) or bidirectional;
    * ``window``: a query sees at most ``window`` earlier keys (and, if bidirectional,
      ``window`` later keys) of its document;
    * ``prefix_lengths``: per document, a bidirectional prefix (prefix-LM); shape
      ``[D]`` with ``cu_seqlens``, ``[B, max_documents]`` with ``document_ids``.

    ``block_size`` is FA4's sparse tile (query, key); ``bwd_block_size`` optionally a
    finer one for the backward (default: ``block_size``). On sm90 with head_dim 65-128
    FA4's backward tiles queries by 64, so ``(64, 128)`` is valid there; it is not the
    default because it is invalid for head_dim <= 64 (query tiles of 128) and on other
    archs, and three H200 runs put it between 1% slower and 5% faster. ``seqlen`` (the
    total length) saves a device sync when given with ``cu_seqlens``.
    ``validate=False`` skips the checks that read values back from the device, for
    CUDA-graph capture. Returns an :class:`AttentionMask`.
    """
    import torch

    if (cu_seqlens is None) == (document_ids is None):
        raise ValueError("make_document_mask: give exactly one of cu_seqlens or document_ids")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 0):
        raise ValueError(f"window: expected a non-negative int, got {window!r}")
    if prefix_lengths is not None and not causal:
        raise ValueError("prefix_lengths: a prefix-LM mask is causal after the prefix; use causal=True")

    if cu_seqlens is not None:
        cu = _as_int_tensor(cu_seqlens, "cu_seqlens")
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(
                f"cu_seqlens: expected a 1-D tensor of at least 2 offsets, got shape {tuple(cu.shape)}"
            )
        if validate:
            _check_int32(cu, "cu_seqlens")
            if int(cu[0]) != 0:
                raise ValueError(f"cu_seqlens: must start at 0, starts at {int(cu[0])}")
            if bool((cu[1:] < cu[:-1]).any()):
                raise ValueError("cu_seqlens: offsets must be non-decreasing (sorted)")
        total = int(cu[-1]) if seqlen is None else int(seqlen)
        if validate and seqlen is not None and int(cu[-1]) != seqlen:
            raise ValueError(f"cu_seqlens: total length {int(cu[-1])} does not match seqlen={seqlen}")
        cu = cu.to(torch.int64)
        start, end, doc = _doc_bounds_from_cu(cu, total)
        batch = 1
        device = cu.device
    else:
        ids = _as_int_tensor(document_ids, "document_ids")
        if ids.dim() != 2:
            raise ValueError(f"document_ids: expected [batch, seqlen], got shape {tuple(ids.shape)}")
        batch, total = ids.shape
        if seqlen is not None and seqlen != total:
            raise ValueError(f"document_ids: length {total} does not match seqlen={seqlen}")
        start, end, doc = _doc_bounds_from_ids(ids)
        device = ids.device
    if total <= 0:
        raise ValueError("make_document_mask: total sequence length must be positive")

    m = torch.arange(total, device=device, dtype=torch.int64).view(1, total)
    if causal:
        lo = start if window is None else torch.maximum(start, m - window)
        hi = m + 1
        if prefix_lengths is not None:
            p = _as_int_tensor(prefix_lengths, "prefix_lengths", device=device).to(
                device=device, dtype=torch.int64
            )
            if validate and bool((p < 0).any()):
                raise ValueError("prefix_lengths: must be non-negative")
            if cu_seqlens is not None:
                if p.dim() != 1 or p.numel() != cu.numel() - 1:
                    raise ValueError(
                        f"prefix_lengths: expected shape [{cu.numel() - 1}] (one per document), got {tuple(p.shape)}"
                    )
                plen = p[doc]
            else:
                if p.dim() != 2 or p.shape[0] != batch:
                    raise ValueError(f"prefix_lengths: expected [batch, max_documents], got {tuple(p.shape)}")
                if validate and int(doc.max()) >= p.shape[1]:
                    raise ValueError(
                        f"prefix_lengths: {p.shape[1]} columns but a row has {int(doc.max()) + 1} documents"
                    )
                plen = torch.gather(p, 1, doc.clamp(max=p.shape[1] - 1))
            pend = torch.minimum(start + plen, end)
            in_prefix = m < pend
            lo = torch.where(in_prefix, start, lo)
            hi = torch.where(in_prefix, pend, hi)
        variant_causal = prefix_lengths is None
    else:
        lo = start if window is None else torch.maximum(start, m - window)
        hi = end if window is None else torch.minimum(end, m + window + 1)
        variant_causal = False

    lo32 = lo.to(torch.int32).expand(batch, total)
    hi32 = hi.to(torch.int32).expand(batch, total)
    mod = interval_mask(causal=variant_causal, row_intervals=interval_masking_enabled())
    if variant_causal:
        aux = [_pad_rows(lo32, BIG)]
    else:
        aux = [_pad_rows(lo32, 0), _pad_rows(hi32, 0)]
    intervals = (lo32.unsqueeze(1), hi32.unsqueeze(1))
    fwd = bwd = None
    if block_sparse:
        from .blocksparse import block_sparse_tensors

        fwd, bwd = block_sparse_tensors(
            *intervals,
            seqlen_q=total,
            seqlen_k=total,
            block_size=block_size,
            bwd_block_size=bwd_block_size,
        )
    name = (
        "document"
        + ("_causal" if causal else "")
        + ("_window" if window is not None else "")
        + ("_prefix" if prefix_lengths is not None else "")
    )
    return AttentionMask(mod, aux, fwd, bwd, total, batch, name, intervals)


def make_draft_block_mask(
    anchors: Any,
    *,
    context_len: int,
    block_size: int,
    block_sparse: bool = True,
    sparse_block_size: tuple[int, int] = (128, 128),
    validate: bool = True,
) -> AttentionMask:
    """Anchored draft-block mask for speculative-decoding draft training.

    Each row is ``context_len`` context tokens followed by ``K`` draft blocks of
    ``block_size`` tokens. Context tokens attend causally. The queries of draft block
    ``j`` see the context up to and including ``anchors[b, j]`` and their whole own
    block (bidirectionally). ``block_size`` is a specialisation (compiled in);
    ``context_len`` and ``anchors`` are geometry (aux tensors): changing them never
    recompiles. ``anchors``: integer tensor ``[B, K]`` with ``0 <= anchor < context_len``.
    """
    import torch

    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    if not isinstance(context_len, int) or isinstance(context_len, bool) or context_len < 0:
        raise ValueError(f"context_len: expected a non-negative int, got {context_len!r}")
    a = _as_int_tensor(anchors, "anchors")
    if a.dim() != 2:
        raise ValueError(f"anchors: expected [batch, num_blocks], got shape {tuple(a.shape)}")
    if validate and a.numel() and (int(a.min()) < 0 or int(a.max()) >= context_len):
        raise ValueError(f"anchors: every anchor must lie in the context, 0 <= anchor < {context_len}")
    B, K = a.shape
    T = context_len + K * block_size
    dev = a.device
    m = torch.arange(T, device=dev, dtype=torch.int64).view(1, T).expand(B, T)
    in_ctx = m < context_len
    blk_idx = ((m - context_len).clamp(min=0) // block_size).clamp(max=max(K - 1, 0))
    anchor_of_row = torch.gather(a.to(torch.int64), 1, blk_idx) if K else torch.zeros_like(m)
    ctx_end = torch.where(in_ctx, m + 1, anchor_of_row + 1)
    blk_start = torch.where(in_ctx, torch.full_like(m, BIG), context_len + blk_idx * block_size)
    ctx32, blk32 = ctx_end.to(torch.int32), blk_start.to(torch.int32)
    aux = [_pad_rows(ctx32, 0), _pad_rows(blk32, BIG)]
    zeros = torch.zeros_like(ctx32)
    blk_hi = torch.where(in_ctx, zeros, (blk_start + block_size).to(torch.int32))
    blk_lo = torch.where(in_ctx, zeros, blk32)
    intervals = (torch.stack([zeros, blk_lo], 1), torch.stack([ctx32, blk_hi], 1))
    fwd = bwd = None
    if block_sparse:
        from .blocksparse import block_sparse_tensors

        fwd, bwd = block_sparse_tensors(*intervals, seqlen_q=T, seqlen_k=T, block_size=sparse_block_size)
    return AttentionMask(
        draft_block_mask(block_size=block_size, row_intervals=interval_masking_enabled()),
        aux,
        fwd,
        bwd,
        T,
        B,
        "draft_block",
        intervals,
    )


class DocumentMaskBuilder:
    """Document masks for a fixed packed length, each built by one CUDA-graph replay.

    ``make_document_mask`` is a few dozen small tensor ops; launched one by one they
    cost about as much CPU time as a short attention call. The builder captures them
    once into a CUDA graph per buffer and afterwards only copies ``cu_seqlens`` into
    a static input and replays: no host sync, tens of microseconds.

    The returned masks live in static buffers, reused round-robin: a mask stays valid
    until ``buffers`` more masks have been built (two by default, enough to build the
    next step's mask while the current step's backward still needs its own).

    Example::

        build = DocumentMaskBuilder(seqlen=65536, max_documents=256)
        for cu_seqlens in loader:                    # int32 on the GPU, length <= 257
            out = flash_attn_func(q, k, v, **build(cu_seqlens))
    """

    def __init__(
        self,
        seqlen: int,
        *,
        max_documents: int,
        causal: bool = True,
        window: int | None = None,
        block_size: tuple[int, int] = (128, 128),
        bwd_block_size: tuple[int, int] | None = None,
        device: Any = "cuda",
        buffers: int = 2,
    ) -> None:
        import torch

        if not isinstance(seqlen, int) or seqlen <= 0:
            raise ValueError(f"seqlen: expected a positive int, got {seqlen!r}")
        if not isinstance(max_documents, int) or max_documents <= 0:
            raise ValueError(f"max_documents: expected a positive int, got {max_documents!r}")
        if buffers < 1:
            raise ValueError(f"buffers: expected at least 1, got {buffers}")
        self.seqlen = seqlen
        self.max_documents = max_documents
        self.kwargs: dict[str, Any] = {
            "causal": causal,
            "window": window,
            "block_size": block_size,
            "bwd_block_size": bwd_block_size,
        }
        self.device = torch.device(device)
        self.use_graphs = self.device.type == "cuda"
        self._slots: list[dict[str, Any]] = [{} for _ in range(buffers)]
        self._next = 0

    def _stage(self, slot: dict[str, Any], cu: Any) -> None:
        n = cu.numel()
        buf = slot["cu"]
        buf[:n].copy_(cu, non_blocking=True)
        if n < buf.numel():
            # Empty trailing documents: repeat the total, on the device (no sync).
            buf[n:].copy_(cu[-1:].expand(buf.numel() - n), non_blocking=True)

    def __call__(self, cu_seqlens: Any) -> AttentionMask:
        import torch

        cu = _as_int_tensor(cu_seqlens, "cu_seqlens")
        if cu.dim() != 1 or not 2 <= cu.numel() <= self.max_documents + 1:
            raise ValueError(
                f"cu_seqlens: expected 2 to {self.max_documents + 1} offsets (max_documents={self.max_documents}), "
                f"got shape {tuple(cu.shape)}"
            )
        if cu.device != self.device and not (cu.device.type == self.device.type == "cuda"):
            raise ValueError(f"cu_seqlens is on {cu.device}, the builder on {self.device}")
        if not self.use_graphs:
            return make_document_mask(cu, seqlen=self.seqlen, **self.kwargs)
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if not slot:
            slot["cu"] = torch.zeros(self.max_documents + 1, dtype=torch.int32, device=self.device)
            self._stage(slot, cu.to(torch.int32))
            # Warm up on a side stream (lazy init, allocator), then capture.
            s = torch.cuda.Stream(device=self.device)
            s.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(s):
                make_document_mask(slot["cu"], seqlen=self.seqlen, validate=False, **self.kwargs)
            torch.cuda.current_stream(self.device).wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                slot["mask"] = make_document_mask(
                    slot["cu"], seqlen=self.seqlen, validate=False, **self.kwargs
                )
            slot["graph"] = g
        self._stage(slot, cu.to(torch.int32) if cu.dtype != torch.int32 else cu)
        slot["graph"].replay()
        return slot["mask"]
