"""Document masks rebuilt by CUDA-graph replay: no host sync, tens of microseconds."""

from __future__ import annotations

import dataclasses
from typing import Any

from fa4cache.masks.document import make_document_mask
from fa4cache.masks.mask import AttentionMask, as_int_tensor, check_flag, check_length


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
        sparse_tile: tuple[int, int] | None = None,
        bwd_sparse_tile: tuple[int, int] | None = None,
        block_sparse: bool = True,
        device: Any = "cuda",
        buffers: int = 2,
    ) -> None:
        import torch

        seqlen = check_length(seqlen, "seqlen")
        max_documents = check_length(max_documents, "max_documents")
        causal = check_flag(causal, "causal")
        block_sparse = check_flag(block_sparse, "block_sparse")
        if seqlen is None or max_documents is None:
            raise TypeError(
                f"seqlen, max_documents: expected positive ints, got {seqlen!r}, {max_documents!r}"
            )
        if buffers < 1:
            raise ValueError(f"buffers: expected at least 1, got {buffers}")
        self.seqlen = seqlen
        self.max_documents = max_documents
        self.kwargs: dict[str, Any] = {
            "causal": causal,
            "window": window,
            "sparse_tile": sparse_tile,
            "bwd_sparse_tile": bwd_sparse_tile,
            # Off when only fa4cache.attention's varlen path uses the masks.
            "block_sparse": block_sparse,
        }
        self.device = torch.device(device)
        self.use_graphs = self.device.type == "cuda"
        if self.use_graphs and not torch.cuda.is_available():
            raise ValueError(
                f"device: DocumentMaskBuilder replays a CUDA graph on {self.device}, but no CUDA GPU is "
                "visible here; pass device='cpu' for the same masks without graphs (or call "
                "make_document_mask)"
            )
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

        cu = as_int_tensor(cu_seqlens, "cu_seqlens")
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
                captured = make_document_mask(slot["cu"], seqlen=self.seqlen, validate=False, **self.kwargs)
            # Every call replays into these same tensors: say so, so that nothing derived
            # from them is cached (AttentionMask.for_head_dim).
            slot["mask"] = dataclasses.replace(captured, rewritten_in_place=True)
            slot["graph"] = g
        self._stage(slot, cu.to(torch.int32) if cu.dtype != torch.int32 else cu)
        slot["graph"].replay()
        return slot["mask"]
