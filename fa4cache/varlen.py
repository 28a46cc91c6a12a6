"""Documents as FA4 varlen sequences: per-document tiling, so no tile straddles a boundary.

A document mask over ``[B, T]`` packed rows is, to FA4's varlen kernels, a list of
sequences: the documents of every row, in order, over the ``B * T`` flattened tokens.
:class:`VarlenLayout` holds what ``flash_attn_varlen_func`` needs for that, built on the
device without a host sync: ``cu_seqlens`` has a fixed capacity of documents (exact for
``cu_seqlens`` input), the unused tail repeats the total (empty sequences, which FA4's
tile scheduler skips). Causal, bidirectional and window masks are FA4's own; prefix-LM is
a ``mask_mod`` in document-local coordinates reading each document's prefix length (kept
for callers of ``flash_attn_varlen_func``; :func:`fa4cache.attention` runs prefix-LM on the
faster dense block-sparse path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VarlenLayout:
    cu_seqlens: Any  # int32 [capacity + 1], over the flattened B * T tokens
    max_seqlen: int | None  # the longest document, if the caller knows it (never synced for)
    causal: bool
    window_size: tuple[int | None, int | None]
    mask_mod: Any = None  # prefix-LM only
    aux_tensors: list[Any] | None = None
    # Whether fa4cache.attention takes this path. Prefix-LM does not: FA4 varlen without
    # block sparsity computes every tile of a document's square, and on an H200 the
    # dense block-sparse path ran it in 0.45x the time (benchmarks/results/varlen_h200.md).
    preferred: bool = True

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``flash_attn_varlen_func(q, k, v, **kwargs)`` on tokens
        flattened to ``[B * T, heads, head_dim]``."""
        kw: dict[str, Any] = {
            "cu_seqlens_q": self.cu_seqlens,
            "cu_seqlens_k": self.cu_seqlens,
            "max_seqlen_q": self.max_seqlen,
            "max_seqlen_k": self.max_seqlen,
            "causal": self.causal,
            "window_size": self.window_size,
        }
        if self.mask_mod is not None:
            kw["mask_mod"] = self.mask_mod
            kw["aux_tensors"] = self.aux_tensors
        return kw


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


def layout(
    *,
    cu: Any,
    causal: bool,
    window: int | None,
    prefix: Any,
    max_seqlen: int | None,
) -> VarlenLayout:
    """The layout for a document mask; ``prefix``: int32 per-document prefix lengths
    (``[capacity]``) for prefix-LM, else None."""
    if prefix is not None:
        from .builtin_masks import document_prefix_mask

        return VarlenLayout(
            cu, max_seqlen, False, (None, None), document_prefix_mask(), [prefix], preferred=False
        )
    if window is None:
        return VarlenLayout(cu, max_seqlen, causal, (None, None))
    return VarlenLayout(cu, max_seqlen, causal, (window, 0 if causal else window))
