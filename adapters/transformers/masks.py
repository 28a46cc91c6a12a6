"""transformers' mask hook for ``"fa4cache"``: the 2-D padding mask as it is, never 4-D,
except where the FA4 path would not compute the mask transformers asked for."""

from __future__ import annotations

from typing import Any

from fa4cache.decode import one_row_sdpa

from .common import compiling, warn_once
from .mask_functions import causality_disagrees, not_computed, not_computed_while_tracing, vmap_reason


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
    compiled or graphed decode step needs; :mod:`fa4cache.decode.key_ranges` reads the tokens'
    slots from it). A one-row eager decode step given no mask (transformers 5.2x's
    ``generate`` drops an all-ones mask) gets a mask of ones where the cache's sizes show its
    keys are all tokens (:func:`fa4cache.decode.one_row_sdpa.mask_for_all_tokens`).

    Where the FA4 path would compute another mask than the one asked for (a rule it does not
    model, or a causality the layers that get it do not say they have: :mod:`.mask_functions`),
    the hook returns transformers' own dense mask, and the layer runs through PyTorch."""
    # A padding mask with a gap inside a row is not looked for here (that would be a host
    # sync in every forward): the FA4 path refuses it on the device.
    if compiling():
        why = not_computed_while_tracing(mask_function, q_length, kwargs)
    else:
        why = vmap_reason(kwargs) or not_computed(mask_function)
    why = why or causality_disagrees(kwargs)
    if why is not None:
        return _dense(
            why, batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, kwargs
        )
    if attention_mask is None:
        device = kwargs.get("device")
        if kwargs.get("local_size") is None:  # full layers: a sliding cache's keys start later
            ones = one_row_sdpa.mask_for_all_tokens(
                batch_size, q_length, kv_length, q_offset, kv_offset, device
            )
            if ones is not None:
                return ones
        if q_length < kv_length and not _bidirectional(mask_function):  # cross-attention's keys are no cache
            # (A one-row eager step asks whether it is all ones: known, not read back.)
            return one_row_sdpa.not_all_ones(
                _tokens_so_far(batch_size, q_length, kv_length, q_offset, kv_offset, device)
            )
        return None
    if attention_mask.dim() != 2:
        return attention_mask
    over_a_cache = attention_mask.shape[1] > q_length or kv_length > attention_mask.shape[1]
    if q_length > 1 and over_a_cache and not _bidirectional(mask_function):  # a prefill over a cache
        _refuse_right_padding(attention_mask, q_offset + q_length - 1)
    if kv_length > attention_mask.shape[1]:
        import torch

        tail = attention_mask.new_zeros(attention_mask.shape[0], kv_length - attention_mask.shape[1])
        return one_row_sdpa.not_all_ones(torch.cat((attention_mask, tail), 1))
    return attention_mask[:, -kv_length:]


_RIGHT_PADDED = (
    "fa4cache: a prefill over a KV cache whose newest token is padding in some row (right padding); "
    "pad on the left (tokenizer.padding_side='left'), or use attn_implementation='sdpa'"
)


def _refuse_right_padding(mask: Any, newest: Any) -> None:
    """A prefill over a cache (a static buffer, a chunk after earlier ones) aligns each row's
    queries to its last token: with right padding that is not the newest position, and the
    real tokens would attend as if shifted. ``mask`` is transformers' 2-D mask, one column per
    position (every layer kind, sliding ones too), ``newest`` the step's last position (a
    tensor for a static cache). A row whose newest position is padding after a token is
    refused on the device (no sync); one with no token yet (a long left padding, chunk by
    chunk) is not. Without a cache the packed path reads right padding as it is; a decode
    step sees it as a gap."""
    import torch

    last = torch.as_tensor(newest, device=mask.device).to(torch.long).clamp(0, mask.shape[1] - 1)
    m = mask.to(torch.bool)
    newest_is_token = m.gather(1, last.reshape(1, 1).expand(m.shape[0], 1)).squeeze(1)
    slots = torch.arange(m.shape[1], device=m.device)
    a_token_before = (m & (slots <= last)).any(1)
    torch._assert_async((newest_is_token | ~a_token_before).all(), _RIGHT_PADDED)


def _bidirectional(mask_function: Any) -> bool:
    from transformers.masking_utils import bidirectional_mask_function

    return mask_function is bidirectional_mask_function


def _tokens_so_far(
    batch: int, q_length: int, kv_length: int, q_offset: Any, kv_offset: Any, device: Any
) -> Any:
    """A step over a cache given no mask (transformers 5.2x drops one without padding): the
    keys that hold tokens. Slot ``s`` holds position ``kv_offset + s`` (a sliding cache's
    keys start later), and the tokens so far are ``q_offset + q_length`` (a static buffer's
    later slots are empty). Without it a step that runs through PyTorch saw the empty slots,
    and a prefill its future tokens. ``q_offset`` may be a tensor (no sync)."""
    import torch

    slots = torch.arange(kv_length, device=device) + kv_offset
    return (slots < q_offset + q_length).view(1, kv_length).expand(batch, kv_length)


def _dense(
    why: str,
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any,
    kv_offset: int,
    mask_function: Any,
    attention_mask: Any,
    kwargs: dict[str, Any],
) -> Any:
    """transformers' boolean ``[B, 1, Tq, Tk]`` mask for sdpa, never skipped as None."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    warn_once(
        why,
        f"fa4cache: {why} runs through PyTorch with transformers' own mask (the FA4 path computes causal, "
        "sliding-window, padding and packed-document masks)",
    )
    if attention_mask is not None and attention_mask.dim() != 2:
        return attention_mask
    rest = {
        k: v for k, v in kwargs.items() if k not in ("allow_is_causal_skip", "allow_is_bidirectional_skip")
    }
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function if mask_function is not None else causal_mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
        **rest,
    )
