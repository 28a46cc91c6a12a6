"""KV-cache steps (``generate``: dynamic, static and sliding caches) and continuous batching
(``generate_batch``: paged caches, transformers 5.17's ``cache``/``read_index``/``write_index``
and 5.2x's ``block_table``/``k_cache``/``v_cache``) on FA4 (:mod:`fa4cache.decode`), each step run as
:func:`fa4cache.decode.choose.choose` says."""

from __future__ import annotations

import weakref
from typing import Any

from fa4cache.decode import kv_cache, paged
from fa4cache.decode import op as decode_op
from fa4cache.decode.choose import OP, choose

from .common import NAMES, compiling, first_kwarg, host_int, patch_once, per_layer_type


def _window_and_scale(
    query: Any, sliding_window: int | None, scaling: float | None
) -> tuple[int | None, float]:
    """transformers' ``sliding_window`` (keys a query sees, itself included) as FA4's
    ``window_size_left`` (keys before it), and the softmax scale (1/sqrt(d) by default)."""
    window = sliding_window - 1 if sliding_window is not None else None
    return window, scaling if scaling is not None else query.shape[-1] ** -0.5


def paged_cache_update(module: Any, key: Any, value: Any, kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    """transformers before 5.2x (5.17 on the H200 image) hands a paged implementation only the
    step's new keys, with the paged cache as ``cache`` and its ``read_index``/``write_index``:
    the implementation writes them into the cache and reads back each sequence's keys, as
    transformers' own ``paged_attention_forward`` does (newer versions do it in the model's
    attention layer, and pass no ``cache``). Returns ``(key, value)`` ``[1, Hkv, Tk, D]``
    (views of the ``[Tk, Hkv, D]`` the cache returns), or None where there is nothing to do."""
    cache = kwargs.get("cache")
    if cache is None or kwargs.get("read_index") is None or kwargs.get("write_index") is None:
        return None
    k, v = cache.update(
        key_states=key,
        value_states=value,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    return k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)


def kv_cache_fallback(query: Any, attention_mask: Any, kwargs: dict[str, Any], dropout: float) -> str | None:
    """Why a step with a KV cache cannot run on FA4 (None: it can)."""
    import torch

    pos = kwargs.get("position_ids")
    if dropout:
        return "attention dropout"
    if attention_mask is not None and attention_mask.dim() != 2:
        return "decoding with a KV cache and a 4-D attention mask"
    if attention_mask is None and (pos is None or pos.dim() != 2):
        return "decoding with a KV cache without a 2-D attention mask or position_ids"
    if torch.is_grad_enabled() and query.requires_grad:
        return "gradients through a KV-cache step"
    return None


# first_of_its_kind's answers: id(module) -> (weak reference to it, its layer_idx, its config,
# the config's own layer_types object, the answer). Reading a transformers config's missing
# attribute costs a decode layer microseconds (two __getattribute__ overrides and an
# exception), in every step.
_first: dict[int, tuple[Any, Any, Any, Any, bool]] = {}
_NONE = object()


def first_of_its_kind(module: Any, compiled: bool | None = None) -> bool:
    """Whether ``module`` is the first layer of its type (full, sliding): the step's mask is
    checked there, once per step and kind, not in every layer (each check is several kernel
    launches, a decode step's main cost at small sizes). Kept per module while its
    ``layer_idx``, ``config`` and the config's ``layer_types`` are the same objects (a list
    changed in place is not seen: give the config a new one); not kept while torch.compile
    traces (a guard on the cache would recompile the model when it changes). ``compiled``:
    whether it does, where the caller knows (else asked)."""
    idx = getattr(module, "layer_idx", None)
    config = getattr(module, "config", None)
    if compiling() if compiled is None else compiled:
        return _first_of_its_kind(idx, config)
    types = getattr(config, "__dict__", {}).get("layer_types", _NONE)
    hit = _first.get(id(module))
    if hit is not None and hit[0]() is module and hit[1] == idx and hit[2] is config and hit[3] is types:
        return hit[4]
    answer = _first_of_its_kind(idx, config)
    try:
        ref = weakref.ref(module)
    except TypeError:  # no weak references to it (a plain namespace): not kept
        return answer
    if len(_first) >= 4096:  # models come and go in a long process: start again
        _first.clear()
    _first[id(module)] = (ref, idx, config, types, answer)
    return answer


def _first_of_its_kind(idx: Any, config: Any) -> bool:
    if not isinstance(idx, int):
        return True
    types = getattr(config, "layer_types", None)
    if not isinstance(types, (list, tuple)) or idx >= len(types):
        return idx == 0
    return types.index(types[idx]) == idx


def kv_cache_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    kwargs: dict[str, Any],
    is_causal: bool | None,
    sliding_window: int | None,
    scaling: float | None,
    softcap: float | None,
    compiled: bool,
    plain: bool,
) -> Any:
    """A step over a KV cache (:mod:`fa4cache.decode`), run as :func:`~fa4cache.decode.choose.choose`
    says. The window is passed whenever the layer has one, even while the cache is shorter:
    the kernel then stays the same as the cache grows past it. ``compiled``: whether
    torch.compile traces; ``plain``: ``generate``'s self-attention step (``choose``'s)."""
    window, scale = _window_and_scale(query, sliding_window, scaling)
    chosen = choose(query, key, value, attention_mask, window, softcap, traced=compiled, plain=plain)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # The step's mask is checked in the first layer of each kind (none for SDPA's step).
    check = chosen.checks_mask and first_of_its_kind(module, compiled)
    pos = kwargs.get("position_ids") if attention_mask is None else None
    args = (query, key, value, attention_mask, pos, causal, window, scale, float(softcap or 0.0), check)
    if chosen is OP:  # one opaque node to the compiler
        return decode_op.op()(*args)
    # Eager: the op's body itself (the dispatcher's round trip is host time in every layer).
    return kv_cache.forward(*args, share=True, chosen=chosen)


def varlen_kv_attention(
    query: Any,
    key: Any,
    value: Any,
    cu_q: Any,
    cu_k: Any,
    kwargs: dict[str, Any],
    causal: bool,
    sliding_window: int | None,
    scaling: float | None,
    softcap: float | None,
) -> Any:
    """Continuous batching's step (queries and keys of each sequence from ``cu_seq_lens_q``
    and ``cu_seq_lens_k``, no mask) as one FA4 varlen call (:func:`fa4cache.decode.paged.varlen_forward`)."""
    window, scale = _window_and_scale(query, sliding_window, scaling)
    max_q = host_int(first_kwarg(kwargs, "max_length_q", "max_seqlen_q"))
    max_k = host_int(per_layer_type(first_kwarg(kwargs, "max_length_k", "max_seqlen_k"), sliding_window))
    args = (query, key, value, cu_q, cu_k, max_q, max_k, causal, window, scale, float(softcap or 0.0))
    return decode_op.varlen_op()(*args) if compiling() else paged.varlen_forward(*args)


def block_table_attention(
    query: Any,
    key: Any,
    value: Any,
    kwargs: dict[str, Any],
    causal: bool,
    sliding_window: int | None,
    scaling: float | None,
    softcap: float | None,
) -> Any:
    """transformers 5.2x's paged decode step (``block_table``, ``k_cache``/``v_cache`` in
    kwargs, as it calls ``flash_attn_with_kvcache``): the step's one new token per sequence
    is written into its page by this call (the cache has not stored it), then FA4 attends
    over the pages (:func:`fa4cache.decode.paged.paged_forward`)."""
    window, scale = _window_and_scale(query, sliding_window, scaling)
    cu_k = per_layer_type(first_kwarg(kwargs, "cu_seq_lens_k", "cu_seqlens_k"), sliding_window)
    return paged.paged_forward(
        query, key, value, kwargs["k_cache"], kwargs["v_cache"], kwargs["block_table"], cu_k,
        causal, window, scale, float(softcap or 0.0),
    )  # fmt: skip


def _ours(config: Any) -> bool:
    return getattr(config, "_attn_implementation", None) in NAMES


def allow_continuous_batching() -> None:
    """Let ``generate_batch`` / ``ContinuousBatchingManager`` keep ``"fa4cache"`` (or
    ``"paged|fa4cache"``, which transformers reads as ``"fa4cache"``): transformers accepts
    only its own implementations there. It then builds no attention mask, and each step
    runs as one FA4 varlen call over the keys it gathers from its paged cache."""
    try:
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
    except ImportError:
        return

    def wrap(fn: Any) -> Any:
        def switch_to_cb_friendly_attn(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
            if _ours(model.config):
                return None
            return fn(self, model, *args, **kwargs)

        return switch_to_cb_friendly_attn

    patch_once(ContinuousBatchingManager, "switch_to_cb_friendly_attn", wrap)
    graphs_by_default()


def graphs_by_default() -> None:
    """transformers 5.2x's continuous batching treats an implementation that needs no attention
    mask differently, and decides which do from the name (``"flash"`` in it): CUDA graphs and
    asynchronous batching on by default, and a paged cache sized without the masks and the
    repeated KV heads of eager/sdpa. ``"fa4cache"`` needs no mask (transformers builds it none)
    and reads the gathered keys as they are, as flash implementations do: it gets their
    defaults and their memory plan. What the user sets (``use_cuda_graph``,
    ``use_async_batching``) stands."""
    try:
        from transformers.generation.continuous_batching import cache as cb_cache
        from transformers.generation.continuous_batching import continuous_api, initialization
    except ImportError:
        return
    decide_graphs = getattr(initialization, "decide_use_cuda_graphs", None)
    decide_async = getattr(initialization, "decide_use_async_batching", None)
    if not hasattr(continuous_api, "resolve_continuous_batching_config") or None in (
        decide_graphs,
        decide_async,
    ):
        return  # an older transformers: 5.17 decides no such defaults

    def resolve(fn: Any) -> Any:
        def resolve_continuous_batching_config(config: Any, cb_config: Any, *args: Any, **kwargs: Any) -> Any:
            resolved = fn(config, cb_config, *args, **kwargs)
            if not _ours(config):
                return resolved
            if cb_config.use_cuda_graph is None:
                resolved.use_cuda_graph = None
                requested = any([cb_config.q_padding_interval_size, cb_config.kv_padding_interval_size])
                decide_graphs(cb_config=resolved, is_attn_mask_needed=False, cuda_graph_requested=requested)
            if cb_config.use_async_batching is None:
                resolved.use_async_batching = None
                decide_async(cb_config=resolved, is_attn_mask_needed=False)
            return resolved

        return resolve_continuous_batching_config

    patch_once(continuous_api, "resolve_continuous_batching_config", resolve)
    handler = getattr(cb_cache, "PagedAttentionMemoryHandler", None)
    if handler is not None:
        patch_once(handler, "__init__", _memory_as_flash)


def _memory_as_flash(init: Any) -> Any:
    """The paged cache's memory plan for ``"fa4cache"`` as for a flash implementation: no
    attention masks (transformers allocates none for it, but would reserve them, twice over
    with asynchronous batching) and K and V read back at their own head count (no repeat)."""

    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        init(self, config, *args, **kwargs)
        if _ours(config) and all(
            hasattr(self, a) for a in ("num_attention_masks", "kv_heads_at_peak", "num_key_value_heads")
        ):
            self.num_attention_masks = 0
            self.kv_heads_at_peak = 2 * self.num_key_value_heads

    return __init__
