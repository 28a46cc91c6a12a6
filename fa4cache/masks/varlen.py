"""Documents as FA4 varlen sequences: per-document tiling, so no tile straddles a boundary.

A document mask over ``[B, T]`` packed rows is, to FA4's varlen kernels, a list of
sequences: the documents of every row, in order, over the ``B * T`` flattened tokens.
:class:`VarlenLayout` holds what ``flash_attn_varlen_func`` needs for that, built on the
device without a host sync: ``cu_seqlens`` has a fixed capacity of documents (exact for
``cu_seqlens`` input), the unused tail repeats the total (empty sequences, which FA4's
tile scheduler skips).

Causal, bidirectional and window masks are one varlen call with FA4's own masking.
Prefix-LM is two calls whose query rows are disjoint (:class:`VarlenCall`), both with
FA4's own masking and no ``mask_mod``: the prefix queries attend the prefix
bidirectionally; the queries after it attend the whole document causally, where FA4's
bottom-right alignment of ``seqlen_q < seqlen_k`` puts each query at its own position.
A single-call form (a ``mask_mod`` reading each document's prefix) remains for callers
of ``flash_attn_varlen_func`` (:meth:`VarlenLayout.kwargs`); it computes every tile of a
document's square, so :func:`fa4cache.attention` does not use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VarlenCall:
    """One FA4 varlen call over the flattened tokens. Sequence ``i`` has the queries
    ``[cu_seqlens_q[i], + seqused_q[i])`` and the keys ``[cu_seqlens_k[i], + seqused_k[i])``
    (lengths from ``cu_seqlens`` differences where ``seqused`` is None). With fewer
    queries than keys, FA4 aligns causal and window masking bottom-right.

    The calls of a layout write disjoint query rows that together cover every token, and
    the first call's keys cover every token: the backward lets it write dK/dV and adds
    the later calls' contributions."""

    cu_seqlens_q: Any
    cu_seqlens_k: Any
    causal: bool
    window_size: tuple[int | None, int | None]
    max_seqlen: int | None
    seqused_q: Any = None
    seqused_k: Any = None

    def fa4_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of FA4's ``_flash_attn_fwd`` / ``_flash_attn_bwd``."""
        return {
            "cu_seqlens_q": self.cu_seqlens_q,
            "cu_seqlens_k": self.cu_seqlens_k,
            "seqused_q": self.seqused_q,
            "seqused_k": self.seqused_k,
            "max_seqlen_q": self.max_seqlen,
            "max_seqlen_k": self.max_seqlen,
            "causal": self.causal,
            "window_size_left": self.window_size[0],
            "window_size_right": self.window_size[1],
        }

    def map_tensors(self, fn: Callable[[Any], Any]) -> VarlenCall:
        return dataclasses.replace(
            self,
            **{n: fn(getattr(self, n)) for n in ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k")},
        )


@dataclass(frozen=True)
class VarlenLayout:
    calls: tuple[VarlenCall, ...]  # what fa4cache.attention runs
    # The same attention as one flash_attn_varlen_func call (kwargs()): calls[0] itself for
    # a one-call layout; for prefix-LM, the documents with mask_mod and aux_tensors.
    single: VarlenCall
    mask_mod: Any = None
    aux_tensors: list[Any] | None = None

    @property
    def cu_seqlens(self) -> Any:
        """int32 ``[capacity + 1]``: the documents over the flattened ``B * T`` tokens."""
        return self.single.cu_seqlens_q

    @property
    def window_size(self) -> tuple[int | None, int | None]:
        return self.single.window_size

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for one ``flash_attn_varlen_func(q, k, v, **kwargs)`` call on
        tokens flattened to ``[B * T, heads, head_dim]``."""
        c = self.single
        kw: dict[str, Any] = {
            "cu_seqlens_q": c.cu_seqlens_q,
            "cu_seqlens_k": c.cu_seqlens_k,
            "max_seqlen_q": c.max_seqlen,
            "max_seqlen_k": c.max_seqlen,
            "causal": c.causal,
            "window_size": c.window_size,
        }
        if self.mask_mod is not None:
            kw["mask_mod"] = self.mask_mod
            kw["aux_tensors"] = self.aux_tensors
        return kw

    def map_tensors(self, fn: Callable[[Any], Any]) -> VarlenLayout:
        """A copy with every tensor replaced by ``fn(tensor)`` (fake copies for cross-compiling)."""
        return dataclasses.replace(
            self,
            calls=tuple(c.map_tensors(fn) for c in self.calls),
            single=self.single.map_tensors(fn),
            aux_tensors=None if self.aux_tensors is None else [fn(t) for t in self.aux_tensors],
        )


def starts_from_change(change: Any, capacity: int) -> tuple[Any, Any]:
    """``cu_seqlens`` (int32, ``[capacity + 1]``) from per-token "a document starts here"
    flags ``[B, T]`` (row starts included), and the flat start positions (``[capacity]``,
    the unused tail at ``B * T``). Raises on the device if there are more documents than
    ``capacity``: documents are never silently merged."""
    import torch

    flat = change.reshape(-1)
    n = flat.numel()
    torch._assert_async(flat.sum() <= capacity, "fa4cache: more documents than max_documents")
    pos = torch.nonzero_static(flat, size=capacity, fill_value=n).reshape(-1)
    cu = torch.cat([pos, pos.new_full((1,), n)]).to(torch.int32)
    return cu, pos


def _window(causal: bool, window: int | None) -> tuple[int | None, int | None]:
    return (None, None) if window is None else (window, 0 if causal else window)


def layout(
    *,
    cu: Any,
    causal: bool,
    window: int | None,
    prefix: Any,
    max_seqlen: int | None,
) -> VarlenLayout:
    """The layout for a document mask; ``prefix``: int32 per-document prefix lengths
    (``[capacity]``) for prefix-LM (causal after the prefix, windowed if ``window``), else None."""
    import torch

    win = _window(causal, window)
    if prefix is None:
        one = VarlenCall(cu, cu, causal, win, max_seqlen)
        return VarlenLayout((one,), one)
    from fa4cache.masks.builtins import document_prefix_mask

    lengths = cu[1:] - cu[:-1]
    # A prefix past the document's end is the whole document.
    plen = torch.minimum(prefix.to(torch.int32).clamp(min=0), lengths)
    suffix_starts = torch.cat([cu[:-1] + plen, cu[-1:]])
    after = VarlenCall(suffix_starts, cu, True, win, max_seqlen, seqused_q=lengths - plen)
    inside = VarlenCall(cu, cu, False, (None, None), max_seqlen, seqused_q=plen, seqused_k=plen)
    return VarlenLayout(
        (after, inside),
        VarlenCall(cu, cu, False, (None, None), max_seqlen),
        document_prefix_mask(window=window),
        [plen.contiguous()],
    )
