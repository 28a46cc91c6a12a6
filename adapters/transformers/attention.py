"""``attention_forward``: transformers' attention signature for ``"fa4cache"``, dispatching a
layer's call to the packed path (training, prefill), a KV-cache step, continuous batching
or the PyTorch fallback."""

from __future__ import annotations

from typing import Any

import fa4cache
from fa4cache.errors import quiet_library_warnings
from fa4cache.ops import packed_attention, step_mask

from . import generation
from .common import compiling, first_kwarg, host_int, per_layer_type, warn_once
from .fallback import fallback

# Keyword arguments after which a step with fewer queries than keys is plain decoding over
# a dynamic or static cache (the fast path below): none of the packed, paged or user-mask ones.
_NOT_PLAIN = ("fa4cache_mask", "cu_seq_lens_q", "cu_seqlens_q", "block_table", "read_index", "cache")
# What a model may pass that FA4's calls here do not apply (the step runs through PyTorch,
# which applies it), by keyword: gpt-oss's attention sinks, T5's relative position bias.
_EXTRAS = {"s_aux": "attention sinks (s_aux)", "sinks": "attention sinks", "position_bias": "a position bias"}
# What a model may pass that fa4cache does not apply at all: attending every key instead
# would be silently wrong. Such models build it into the mask for "sdpa" and "eager" only.
_UNSUPPORTED = {
    "indices": "sparse attention indices (`indices`: the top-k keys of each query)",
    "block_indices": "block-sparse attention indices (`block_indices`)",
}
_NOT_PLAIN += tuple(_EXTRAS) + tuple(_UNSUPPORTED)


def attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention signature: ``query`` ``[B, Hq, Tq, D]``, ``key``/``value``
    ``[B, Hkv, Tk, D]``; returns ``([B, Tq, Hq, D], None)``."""
    args = (module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap, is_causal)
    try:
        if compiling():  # traced: no context manager around the op (it would break the graph)
            return _attention_forward(*args, **kwargs)
        # A decode step first, outside the warnings filter (it costs a decode layer ~10 % of its
        # host time; the step's FA4 call is quieted where it may compile: fa4cache.decode.launch).
        out = _decode_step(*args, kwargs)
        if out is not None:
            return out, None
        with quiet_library_warnings():  # CUTLASS's aux_data note on a compile: not the user's
            return _attention_forward(*args, **kwargs)
    except AssertionError as e:
        # FA4 asserts its inputs are CUDA tensors; the bare assertion names neither the
        # tensors nor the fix. (Checked after the fact, as fa4cache.attention does: tests run
        # a CPU model of FA4.)
        if query.device.type != "cuda":
            raise ValueError(
                f"fa4cache attention: FA4's kernels need CUDA tensors; the model's query, key and value "
                f"are on {query.device} (move the model to a GPU: model.to('cuda'), or load it with "
                "device_map='cuda')"
            ) from e
        raise


def _decode_step(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float,
    scaling: float | None,
    sliding_window: int | None,
    softcap: float | None,
    is_causal: bool | None,
    kwargs: dict[str, Any],
) -> Any:
    """A plain KV-cache step (``generate``'s decode, or a prefill into a static cache) on FA4,
    or None where it is not one (the general path decides). Checked first and cheaply: it
    runs in every layer of every decode step, where host time is the step's time. Whether
    torch.compile traces is asked here, once, not taken from the caller: dynamo may trace
    this function as a frame of its own after a graph break left the caller's eager."""
    if query.shape[2] == key.shape[2] or dropout:
        return None
    for name in _NOT_PLAIN:
        if kwargs.get(name) is not None:
            return None
    if generation.kv_cache_fallback(query, attention_mask, kwargs, dropout) is not None:
        return None
    return generation.kv_cache_attention(
        module, query, key, value, attention_mask, kwargs, is_causal, sliding_window, scaling, softcap,
        compiling(), plain=True,
    )  # fmt: skip


def _attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float,
    scaling: float | None,
    sliding_window: int | None,
    softcap: float | None,
    is_causal: bool | None,
    **kwargs: Any,
) -> tuple[Any, None]:
    out = _decode_step(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout,
        scaling,
        sliding_window,
        softcap,
        is_causal,
        kwargs,
    )
    if out is not None:
        return out, None
    compiled = compiling()
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"fa4cache attention: this model passes {what}, which fa4cache does not apply (it would "
                "attend every key); load the model with attn_implementation='sdpa' or 'eager', for which "
                "the model builds them into the attention mask"
            )
    extra = next((why for name, why in _EXTRAS.items() if kwargs.get(name) is not None), None)
    user_mask = kwargs.get("fa4cache_mask")
    if user_mask is not None:
        # Between compiled graphs (a mask object cannot be an op input; fa4cache.attention
        # is compiler-disabled).
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        return fa4cache.attention(q, k, v, user_mask, softmax_scale=scaling), None
    if extra is not None and kwargs.get("block_table") is not None:
        _refuse_batching(extra)
    if all(kwargs.get(n) is not None for n in ("block_table", "k_cache", "v_cache")):
        # transformers 5.2x's paged decode: the kernel call writes the new keys.
        out = generation.block_table_attention(
            query, key, value, kwargs, causal, sliding_window, scaling, softcap
        )
        return out, None
    cu = first_kwarg(kwargs, "cu_seq_lens_q", "cu_seqlens_q")
    if cu is not None:
        kind, source = "cu_seqlens", cu
    elif attention_mask is not None and attention_mask.dim() == 2:
        kind, source = "padding", attention_mask
    elif kwargs.get("position_ids") is not None:
        kind, source = "position_ids", kwargs["position_ids"]
    elif attention_mask is None and query.shape[2] == key.shape[2]:
        # Nothing marks documents (a vision or audio encoder, a model that passes no
        # position_ids): each row is one, as sdpa and eager attend it.
        kind, source = "cu_seqlens", _rows(query.shape[0], query.shape[2], query.device, compiled)
    else:
        kind, source = None, None
    # Cross-attention's 2-D mask marks the encoder's keys, not documents of the queries (read
    # as documents, a decoder as long as the encoder attended the wrong keys). It runs as a
    # step over keys, as a shorter decoder does.
    cross = kind == "padding" and not causal and _cross_attention(module)
    cu_k = per_layer_type(first_kwarg(kwargs, "cu_seq_lens_k", "cu_seqlens_k"), sliding_window)
    paged = generation.paged_cache_update(module, key, value, kwargs)
    if paged is not None:
        key, value = paged
    if extra is not None and (paged is not None or (cu is not None and query.shape[2] != key.shape[2])):
        _refuse_batching(extra)
    # Continuous batching: the step's new tokens against each sequence's whole keys.
    cb = cu is not None and cu_k is not None and cu_k is not cu
    if (
        cb
        and (paged is not None or query.shape[2] != key.shape[2])
        and attention_mask is None
        and not dropout
    ):
        out = generation.varlen_kv_attention(
            query, key, value, cu, cu_k, kwargs, causal, sliding_window, scaling, softcap
        )
        return out, None
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    window = sliding_window - 1 if sliding_window is not None and sliding_window < q.shape[1] else None
    why = extra
    if why is not None:
        pass
    elif q.shape[1] != k.shape[1] or cross:
        why = generation.kv_cache_fallback(query, attention_mask, kwargs, dropout)
        if why is None:
            return generation.kv_cache_attention(
                module, query, key, value, attention_mask, kwargs, causal, sliding_window, scaling, softcap,
                compiled, plain=False,
            ), None  # fmt: skip
    elif _own_terms_without_causality(
        attention_mask,
        is_causal if is_causal is not None else getattr(module, "is_causal", None),
        q.shape[1],
        k.shape[1],
    ):
        raise ValueError(
            f"fa4cache attention: {type(module).__name__} adds terms of its own to the attention mask (one "
            "row for all queries: ALiBi or another position bias) on top of fa4cache's 2-D padding mask, "
            "which holds no causal rule, so its layers would attend future tokens; load the model with "
            "attn_implementation='eager' or 'sdpa'"
        )
    elif dropout:
        why = "attention dropout"
    elif attention_mask is not None and attention_mask.dim() != 2:
        # With cu_seq_lens too (a flattening collator): the 4-D mask is a rule the FA4 path
        # does not model (the hook's own, for Llama 4's chunks, Gemma 3's images) or the user's.
        why = "a 4-D attention mask"
    elif source is None:
        raise ValueError(
            "fa4cache attention: no position_ids, cu_seq_lens_q or attention mask to find documents in"
        )
    if why is not None:
        warn_once(
            why,
            f"fa4cache: {why} runs through PyTorch (FA4 path: packed and padded training/prefill, "
            "and KV-cache steps with a 2-D left-padding mask or position_ids)",
        )
        allowed = None
        if (
            q.shape[1] == k.shape[1]
            and source is not None
            and (attention_mask is None or attention_mask.dim() == 2)
            and not (kind == "padding" and not causal)
        ):
            # Training or prefill: the fallback keeps the step's documents (and padding) apart
            # as the FA4 path does, with the same mask. (Without causality a padding mask
            # only hides keys, as eager reads it: cross-attention's queries are not its rows.)
            # A 4-D mask is the whole rule, as eager and sdpa read it (transformers puts
            # packed documents in it from position_ids; neither reads cu_seq_lens).
            allowed = step_mask.step_mask(
                batch=q.shape[0], seqlen=q.shape[1], causal=causal, window=window,
                **{kind: source},  # the kinds are step_mask's argument names
            ).dense()[:, None]  # fmt: skip
        sinks = first_kwarg(kwargs, "s_aux", "sinks")
        return fallback(
            q, k, v, attention_mask, scaling, sliding_window, causal, softcap, dropout, allowed,
            sinks=sinks, bias=kwargs.get("position_bias"),
        ), None  # fmt: skip
    # Under torch.compile a host int here would be a guard that recompiles per packing:
    # it is not read at all then (FA4 bounds by the total, without a sync).
    max_seqlen = None
    if not compiled:
        max_seqlen = host_int(first_kwarg(kwargs, "max_length_q", "max_seqlen_q"))
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out, _ = packed_attention.op()(
        q, k, v, source, kind, causal, window, scale, float(softcap or 0.0), max_seqlen
    )
    return out, None


def _own_terms_without_causality(attention_mask: Any, causal: bool | None, tq: int, tk: int) -> bool:
    """Whether a layer that says it is causal (``is_causal``: True, not the adapter's default for
    layers that say nothing: BERT-style encoders, LayoutLM and MarkupLM, pass their own one-row
    padding masks and are not causal) got, over more than one query, an additive 4-D mask with
    one row for all its queries. transformers' masks for eager and sdpa have a row per query
    (the causal rule is in them); such a mask is a model's own terms added to what the mask
    hook returned for fa4cache, the 2-D padding mask (transformers 5.25's ALiBi Falcon:
    1.65 off eager at batch 1). Read as the whole rule, as a 4-D mask is, it attends the future."""
    return (
        causal is True
        and tq == tk > 1
        and attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.is_floating_point()
        and attention_mask.shape[-2] == 1
    )


def _cross_attention(module: Any) -> bool:
    """Whether a non-causal layer attends another sequence (an encoder's), by what
    transformers' layers say of themselves: ``is_decoder`` (Bart, T5, Whisper, ...),
    ``is_cross_attention`` (GPT-2), a ``*CrossAttention`` class (BERT's, T5Gemma, Dia, Canary,
    CohereAsr), or a decoder's config (a non-causal layer of a decoder is no self-attention).
    Reading an encoder's own mask as keys would be right too, only slower (its padding
    queries are computed): the test decides speed, never what is attended."""
    if getattr(module, "is_decoder", False) is True or getattr(module, "is_cross_attention", False) is True:
        return True
    if "CrossAttention" in type(module).__name__:
        return True
    config = getattr(module, "config", None)
    return (
        getattr(config, "is_decoder", False) is True or getattr(config, "add_cross_attention", False) is True
    )


_row_offsets: dict[tuple[int, int, Any, bool], Any] = {}


def _rows(batch: int, seqlen: int, device: Any, compiled: bool) -> Any:
    """``cu_seqlens`` of one document per row; eager calls get the same tensor in every
    layer (the step's mask is built once, keyed by its source tensor)."""
    import torch

    # Not kept from a CUDA-graph capture (its values exist only in that graph's replays);
    # one made under inference_mode serves only calls under it (autograd may not save it).
    keep = not compiled and not step_mask.is_capturing()
    key = (batch, seqlen, device, torch.is_inference_mode_enabled())
    hit = _row_offsets.get(key) if keep else None
    if hit is None:
        hit = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
        if keep:
            if len(_row_offsets) >= 64:
                _row_offsets.clear()
            _row_offsets[key] = hit
    return hit


def _refuse_batching(extra: str) -> None:
    raise ValueError(
        f"fa4cache attention: this model passes {extra}, which FA4's kernels here do not apply, and "
        "fa4cache's PyTorch path for it does not run continuous batching; load the model with "
        "attn_implementation='eager' for generate_batch"
    )
