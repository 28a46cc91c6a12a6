"""transformers integration: an attention implementation named ``"fa4cache"``.

Two lines in a training script::

    fa4cache.adapters.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa4cache")

What it does, per forward step (the mask is built once and shared by every layer):

* **Packed batches** (``DataCollatorWithFlattening``): documents come from
  ``cu_seq_lens_q``/``cu_seqlens_q`` (either naming, with ``max_length_q``/``max_seqlen_q``)
  or from ``position_ids`` that restart at each document; they run on FA4's varlen
  kernels (per-document tiles) through one custom op per layer
  (:mod:`.packed_attention`). A 2-D padding mask becomes documents too (padding never
  attends to text). No 4-D mask is ever built.
* **torch.compile**: the op is opaque to the compiler, so the whole model compiles into
  one graph (``fullgraph=True`` works) and fuses around the attention, with no recompile
  for a new packing. Only a caller's own ``fa4cache_mask`` runs between graphs.
* **Sliding windows** (Mistral, Qwen with ``use_sliding_window``): transformers' window of
  ``w`` keys is fa4cache's ``window=w - 1`` (the query itself plus ``w - 1`` earlier keys).
* **Other masks**: a fa4cache mask passed as ``model(..., fa4cache_mask=mask)`` is used by
  every layer (prefix-LM, draft-block, custom templates).
* **Logit softcapping** (Gemma 2) runs in FA4's kernels (its softcap score_mod).
* **Steps over a KV cache** (``generate`` with a dynamic or static cache, any batch, left
  padding; decode and prefill into a static cache) run as one FA4 call per layer over
  the cache as it lies (:mod:`.kv_cache`), with sliding windows and softcapping, no host
  sync and one kernel per layer kind whatever the batch size or cache length.
* Attention dropout, 4-D masks without document boundaries, KV-cache steps with neither
  a 2-D mask nor ``position_ids``, and gradients through a KV-cache step run through
  PyTorch with one warning naming the reason; they never crash. In training and
  prefill that fallback applies the step's own document mask, so packed documents stay
  apart there too; softcapping and dropout are applied as transformers' eager attention
  does.

Host syncs: none with ``cu_seq_lens`` or a 2-D padding mask, or with ``position_ids`` when
``register(max_documents=N)`` bounds the documents per step (what CUDA-graph capture needs);
otherwise the documents of a step are counted once (one sync per step, not per layer).
transformers itself checks ``position_ids`` for packing once per forward in eager mode.

``register()`` also makes transformers' own ``"flash_attention_4"`` path take packed
batches: transformers passes the longest document as a 0-d tensor, which FA4's forward
cannot take as a Python int; the wrapper passes ``None`` instead (FA4 then bounds by the
total, without a sync).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from fa4cache.adapters.compile import ahead as compile_ahead

import fa4cache
from fa4cache.errors import quiet_library_warnings
from fa4cache.ops import kv_cache, packed_attention, step_mask
from fa4cache.ops.step_mask import set_max_documents

log = logging.getLogger(__name__)

NAME = "fa4cache"
_warned: set[str] = set()


def register(*, max_documents: int | None = None, fix_flash_attention_4: bool = True) -> None:
    """Register ``attn_implementation="fa4cache"`` with transformers (and install the store).

    ``max_documents``: an upper bound on the documents of one step (over the whole batch),
    for steps whose documents come only from ``position_ids``: the step then needs no
    host sync (and can be captured in a CUDA graph); more documents than that raise on the
    device rather than merge.
    """
    from fa4cache.extras import require

    require("fa4cache.adapters.transformers", "transformers", "torch", "flash_attn", "cutlass")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    set_max_documents(max_documents)
    fa4cache.install()
    compile_ahead.watch_model_loads()
    packed_attention.op()
    kv_cache.op()
    # "paged|fa4cache" (continuous batching) by its own name too: transformers before 5.2x
    # accepts a "paged|" implementation only when that exact name is registered.
    for name in (NAME, f"paged|{NAME}"):
        AttentionInterface.register(name, attention_forward)
        AttentionMaskInterface.register(name, padding_mask)
    _allow_continuous_batching()
    if fix_flash_attention_4:
        _fix_flash_attention_4()


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
    step needs; :mod:`.kv_cache` reads the tokens' slots from it)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return attention_mask
    if kv_length > attention_mask.shape[1]:
        import torch

        tail = attention_mask.new_zeros(attention_mask.shape[0], kv_length - attention_mask.shape[1])
        return torch.cat((attention_mask, tail), 1)
    return attention_mask[:, -kv_length:]


def _warn_once(tag: str, message: str) -> None:
    if tag not in _warned:
        _warned.add(tag)
        log.warning(message)


def _first_kwarg(kwargs: dict[str, Any], *names: str) -> Any:
    for n in names:
        if kwargs.get(n) is not None:
            return kwargs[n]
    return None


def _host_int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


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
        if _compiling():  # traced: no context manager around the op (it would break the graph)
            return _attention_forward(*args, **kwargs)
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
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    user_mask = kwargs.get("fa4cache_mask")
    if user_mask is not None:
        # Between compiled graphs (a mask object cannot be an op input; fa4cache.attention
        # is compiler-disabled).
        return fa4cache.attention(q, k, v, user_mask, softmax_scale=scaling), None
    cu = _first_kwarg(kwargs, "cu_seq_lens_q", "cu_seqlens_q")
    window = sliding_window - 1 if sliding_window is not None and sliding_window < q.shape[1] else None
    if cu is not None:
        kind, source = "cu_seqlens", cu
    elif attention_mask is not None and attention_mask.dim() == 2:
        kind, source = "padding", attention_mask
    elif kwargs.get("position_ids") is not None:
        kind, source = "position_ids", kwargs["position_ids"]
    else:
        kind, source = None, None
    cu_k = _per_layer_type(_first_kwarg(kwargs, "cu_seq_lens_k", "cu_seqlens_k"), sliding_window)
    paged = _paged_cache_update(module, key, value, kwargs)
    if paged is not None:
        key, value = paged
        k, v = key.transpose(1, 2), value.transpose(1, 2)
    # Continuous batching: the step's new tokens against each sequence's whole keys.
    cb = cu is not None and cu_k is not None and cu_k is not cu
    if cb and (paged is not None or q.shape[1] != k.shape[1]) and attention_mask is None and not dropout:
        out = _varlen_kv_attention(
            query, key, value, cu, cu_k, kwargs, causal, sliding_window, scaling, softcap
        )
        return out, None
    why = None
    if q.shape[1] != k.shape[1]:
        why = _kv_cache_fallback(query, attention_mask, kwargs, dropout)
        if why is None:
            return _kv_cache_attention(
                query,
                key,
                value,
                attention_mask,
                kwargs,
                causal,
                sliding_window,
                scaling,
                softcap,
                _first_of_its_kind(module),
            ), None
    elif dropout:
        why = "attention dropout"
    elif attention_mask is not None and attention_mask.dim() != 2 and cu is None:
        why = "a 4-D attention mask"
    elif source is None:
        raise ValueError(
            "fa4cache attention: no position_ids, cu_seq_lens_q or attention mask to find documents in"
        )
    if why is not None:
        _warn_once(
            why,
            f"fa4cache: {why} runs through PyTorch (FA4 path: packed and padded training/prefill, "
            "and KV-cache steps with a 2-D left-padding mask or position_ids)",
        )
        allowed = None
        if (
            q.shape[1] == k.shape[1]
            and source is not None
            and (attention_mask is None or attention_mask.dim() == 2)
        ):
            # Training or prefill: the fallback keeps the step's documents (and padding) apart
            # as the FA4 path does, with the same mask.
            allowed = step_mask.step_mask(
                batch=q.shape[0], seqlen=q.shape[1], causal=causal, window=window,
                **{kind: source},  # the kinds are step_mask's argument names
            ).dense()[:, None]  # fmt: skip
        return _fallback(
            q, k, v, attention_mask, scaling, sliding_window, causal, softcap, dropout, allowed
        ), None
    # Under torch.compile a host int here would be a guard that recompiles per packing:
    # it is not read at all then (FA4 bounds by the total, without a sync).
    max_seqlen = None
    if not _compiling():
        max_seqlen = _host_int(_first_kwarg(kwargs, "max_length_q", "max_seqlen_q"))
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out, _ = packed_attention.op()(
        q, k, v, source, kind, causal, window, scale, float(softcap or 0.0), max_seqlen
    )
    return out, None


def _per_layer_type(value: Any, sliding_window: int | None) -> Any:
    """Continuous batching's per-layer-type value (``cu_seq_lens_k``, ``max_seqlen_k``: a dict
    by layer type when a model mixes full and sliding layers) for this layer."""
    if isinstance(value, dict):
        return value["sliding_attention" if sliding_window else "full_attention"]
    return value


def _paged_cache_update(module: Any, key: Any, value: Any, kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
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


def _kv_cache_fallback(query: Any, attention_mask: Any, kwargs: dict[str, Any], dropout: float) -> str | None:
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


def _first_of_its_kind(module: Any) -> bool:
    """Whether ``module`` is the first layer of its type (full, sliding): the step's mask is
    checked there, once per step and kind, not in every layer (each check is several kernel
    launches, a decode step's main cost at small sizes)."""
    idx = getattr(module, "layer_idx", None)
    if not isinstance(idx, int):
        return True
    types = getattr(getattr(module, "config", None), "layer_types", None)
    if not isinstance(types, (list, tuple)) or idx >= len(types):
        return idx == 0
    return types.index(types[idx]) == idx


def _kv_cache_attention(
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    kwargs: dict[str, Any],
    causal: bool,
    sliding_window: int | None,
    scaling: float | None,
    softcap: float | None,
    check_mask: bool = True,
) -> Any:
    """A step over a KV cache on FA4 (:mod:`.kv_cache`). The window is passed whenever the
    layer has one, even while the cache is shorter: the kernel then stays the same as the
    cache grows past it."""
    window = sliding_window - 1 if sliding_window is not None else None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    pos = kwargs.get("position_ids") if attention_mask is None else None
    return kv_cache.op()(
        query, key, value, attention_mask, pos, causal, window, scale, float(softcap or 0.0), check_mask
    )


def _varlen_kv_attention(
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
    and ``cu_seq_lens_k``, no mask) as one FA4 varlen call (:func:`.kv_cache.varlen_forward`)."""
    window = sliding_window - 1 if sliding_window is not None else None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    max_q = _host_int(_first_kwarg(kwargs, "max_length_q", "max_seqlen_q"))
    max_k = _host_int(_per_layer_type(_first_kwarg(kwargs, "max_length_k", "max_seqlen_k"), sliding_window))
    return kv_cache.varlen_op()(
        query, key, value, cu_q, cu_k, max_q, max_k, causal, window, scale, float(softcap or 0.0)
    )


def _allow_continuous_batching() -> None:
    """Let ``generate_batch`` / ``ContinuousBatchingManager`` keep ``"fa4cache"`` (or
    ``"paged|fa4cache"``, which transformers reads as ``"fa4cache"``): transformers accepts
    only its own implementations there. It then builds no attention mask, and each step
    runs as one FA4 varlen call over the keys it gathers from its paged cache."""
    try:
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
    except ImportError:
        return
    fn = ContinuousBatchingManager.switch_to_cb_friendly_attn
    if getattr(fn, "__fa4cache__", False):
        return

    @functools.wraps(fn)
    def switch_to_cb_friendly_attn(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        if model.config._attn_implementation in (NAME, f"paged|{NAME}"):
            return None
        return fn(self, model, *args, **kwargs)

    switch_to_cb_friendly_attn.__fa4cache__ = True  # type: ignore[attr-defined]
    ContinuousBatchingManager.switch_to_cb_friendly_attn = switch_to_cb_friendly_attn  # type: ignore[method-assign]


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def _fallback(
    q: Any,
    k: Any,
    v: Any,
    attention_mask: Any,
    scale: float | None,
    sliding_window: int | None,
    causal: bool,
    softcap: float | None,
    dropout: float,
    allowed: Any = None,
) -> Any:
    """What the FA4 path does not cover, in PyTorch: ``allowed`` (``[B, 1, Tq, Tk]``
    booleans: the step's document mask) where given, else a mask from ``attention_mask``
    or causal (bottom-right for a cache) with the window. SDPA where it computes the same;
    softcapping and attention dropout are applied by hand, as transformers' eager path does."""
    import torch

    B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
    if allowed is None and attention_mask is not None and attention_mask.dim() == 4:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    elif allowed is None:
        i = torch.arange(Tq, device=q.device).view(Tq, 1) + (Tk - Tq)
        j = torch.arange(Tk, device=q.device).view(1, Tk)
        allowed = (j <= i) if causal else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
        if sliding_window is not None:
            allowed = allowed & (j > i - sliding_window)
        allowed = allowed.view(1, 1, Tq, Tk)
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, -Tk:].bool().view(B, 1, 1, Tk)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    if not softcap and not dropout:
        out = torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, attn_mask=allowed, scale=scale, enable_gqa=q.shape[2] != k.shape[2]
        )
        return out.transpose(1, 2)
    group = q.shape[2] // k.shape[2]
    kt, vt = (t.repeat_interleave(group, dim=1) for t in (kt, vt))
    scores = torch.matmul(qt, kt.transpose(2, 3)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if dropout:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return torch.matmul(probs, vt).transpose(1, 2)


def _fix_flash_attention_4() -> None:
    """transformers' FA4 path passes ``max_seqlen_q`` as a 0-d tensor; FA4 needs an int or
    None. Wrap ``flash_attn.cute.flash_attn_varlen_func`` to pass None for a tensor."""
    try:
        import flash_attn.cute as fa
    except ImportError:
        return
    fn = fa.flash_attn_varlen_func
    if getattr(fn, "__fa4cache_max_seqlen_fix__", False):
        return

    @functools.wraps(fn)
    def flash_attn_varlen_func(*args: Any, **kwargs: Any) -> Any:
        for name in ("max_seqlen_q", "max_seqlen_k"):
            if getattr(kwargs.get(name), "dim", None) is not None:
                kwargs[name] = None
        return fn(*args, **kwargs)

    flash_attn_varlen_func.__fa4cache_max_seqlen_fix__ = True  # type: ignore[attr-defined]
    fa.flash_attn_varlen_func = flash_attn_varlen_func
