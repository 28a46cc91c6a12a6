"""transformers' mask hook for ``"fa4cache"``: the 2-D padding mask as it is, never 4-D."""

from __future__ import annotations

from typing import Any


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Any = None,
    **kwargs: Any,
) -> Any:
    """transformers' mask hook: the 2-D padding mask as it is (sliced to the keys), never a
    4-D mask and never a check that reads the mask back from the device. A static cache's
    keys outnumber the tokens so far: its mask is padded with False to the buffer's length,
    so that the mask of every decode step has one shape (what a compiled or graphed decode
    step needs; :mod:`fa4cache.ops.kv_cache` reads the tokens' slots from it)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return attention_mask
    if kv_length > attention_mask.shape[1]:
        import torch

        tail = attention_mask.new_zeros(attention_mask.shape[0], kv_length - attention_mask.shape[1])
        return torch.cat((attention_mask, tail), 1)
    return attention_mask[:, -kv_length:]

