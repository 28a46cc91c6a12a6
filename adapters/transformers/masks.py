"""transformers' mask hook for ``"fa4cache"``: the 2-D padding mask as it is, never 4-D."""

from __future__ import annotations

from typing import Any

from fa4cache.ops import one_row_decode


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
    4-D mask. A static cache's keys outnumber the tokens so far: its mask is padded with
    False to the buffer's length, so that the mask of every decode step has one shape (what a
    compiled or graphed decode step needs; :mod:`fa4cache.ops.kv_cache` reads the tokens'
    slots from it). A one-row eager decode step given no mask (transformers 5.2x's
    ``generate`` drops an all-ones mask) gets a mask of ones where the cache's sizes show its
    keys are all tokens (:func:`fa4cache.ops.one_row_decode.mask_for_all_tokens`)."""
    if attention_mask is None:
        if kwargs.get("local_size") is None:  # full layers only: a sliding cache's keys start later
            return one_row_decode.mask_for_all_tokens(
                batch_size, q_length, kv_length, q_offset, kv_offset, kwargs.get("device")
            )
        return None
    if attention_mask.dim() != 2:
        return attention_mask
    if kv_length > attention_mask.shape[1]:
        import torch

        tail = attention_mask.new_zeros(attention_mask.shape[0], kv_length - attention_mask.shape[1])
        return torch.cat((attention_mask, tail), 1)
    return attention_mask[:, -kv_length:]
