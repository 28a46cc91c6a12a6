"""Per-document lengths of ``document_ids`` packings, for tests that draw prefix lengths
(a prefix is at most its document's length)."""

from __future__ import annotations

from typing import Any


def run_lengths(ids: Any, width: int) -> Any:
    """``[B, width]``: row b's documents' lengths (runs of equal ids, in order), 0 past its last."""
    import torch

    out = torch.zeros(ids.shape[0], width, dtype=torch.int64, device=ids.device)
    for b in range(ids.shape[0]):
        counts = torch.unique_consecutive(ids[b], return_counts=True)[1][:width]
        out[b, : counts.numel()] = counts
    return out
