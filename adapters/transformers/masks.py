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
    slots from it). A one-row eager decode step's mask is read back once, as transformers'
    sdpa reads it (:func:`fa4cache.ops.one_row_decode.check`)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return attention_mask
    if kv_length > attention_mask.shape[1]:
        import torch

        tail = attention_mask.new_zeros(attention_mask.shape[0], kv_length - attention_mask.shape[1])
        return torch.cat((attention_mask, tail), 1)
    mask = attention_mask[:, -kv_length:]
    if batch_size == 1 and q_length == 1 and kwargs.get("local_size") is None:
        # A one-row decode step over a dynamic cache's full layers: one host sync reads whether
        # it has padding, as transformers' sdpa mask does; none runs on SDPA's kernel.
        one_row_decode.check(mask)
    return mask
