"""transformers integration: an attention implementation named ``"fa4cache"``.

Two lines in a training script::

    fa4cache.adapters.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa4cache")

What it does, per forward step (the mask is built once and shared by every layer):

* **Packed batches** (``DataCollatorWithFlattening``): documents come from
  ``cu_seq_lens_q``/``cu_seqlens_q`` (either naming, with ``max_length_q``/``max_seqlen_q``)
  or from ``position_ids`` that restart at each document; they run through
  :func:`fa4cache.attention` on FA4's varlen kernels (per-document tiles). A 2-D padding
  mask becomes documents too (padding never attends to text). No 4-D mask is ever built.
* **Sliding windows** (Mistral, Qwen with ``use_sliding_window``): transformers' window of
  ``w`` keys is fa4cache's ``window=w - 1`` (the query itself plus ``w - 1`` earlier keys).
* **Other masks**: a fa4cache mask passed as ``model(..., fa4cache_mask=mask)`` is used by
  every layer (prefix-LM, draft-block, custom templates).
* **Decoding with a KV cache**, dropout, softcapping and 4-D masks without document
  boundaries run through PyTorch SDPA with one warning; they never crash.

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
import threading
import weakref
from typing import Any

log = logging.getLogger(__name__)

NAME = "fa4cache"
_lock = threading.Lock()
_options: dict[str, Any] = {"max_documents": None}
_warned: set[str] = set()
# The step's masks, keyed by the identity and version of the tensors they came from.
_cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def register(*, max_documents: int | None = None, fix_flash_attention_4: bool = True) -> None:
    """Register ``attn_implementation="fa4cache"`` with transformers (and install the store).

    ``max_documents``: an upper bound on the documents of one step (over the whole batch),
    for steps whose documents come only from ``position_ids``: the step then needs no
    host sync (and can be captured in a CUDA graph); more documents than that raise on the
    device rather than merge.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    import fa4cache

    if max_documents is not None and (not isinstance(max_documents, int) or max_documents <= 0):
        raise ValueError(f"max_documents: expected a positive int, got {max_documents!r}")
    _options["max_documents"] = max_documents
    fa4cache.install()
    AttentionInterface.register(NAME, _outside_compiled_graphs(attention_forward))
    AttentionMaskInterface.register(NAME, padding_mask)
    if fix_flash_attention_4:
        _fix_flash_attention_4()


def _outside_compiled_graphs(fn: Any) -> Any:
    """Under ``torch.compile`` the attention runs eagerly between compiled graphs (one
    graph break per layer): FA4's Python interface and the step-mask cache are not
    traceable, and the rest of the layer still compiles and fuses."""
    import torch

    return functools.wraps(fn)(torch.compiler.disable(fn, recursive=True))


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
    4-D mask and never a check that reads the mask back from the device."""
    if attention_mask is None or attention_mask.dim() != 2:
        return attention_mask
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
    import fa4cache

    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    user_mask = kwargs.get("fa4cache_mask")
    if user_mask is not None:
        return fa4cache.attention(q, k, v, user_mask, softmax_scale=scaling), None
    cu = _first_kwarg(kwargs, "cu_seq_lens_q", "cu_seqlens_q")
    why = None
    if q.shape[1] != k.shape[1]:
        why = "decoding with a KV cache"
    elif dropout:
        why = "attention dropout"
    elif softcap:
        why = "logit softcapping"
    elif attention_mask is not None and attention_mask.dim() != 2 and cu is None:
        why = "a 4-D attention mask"
    if why is not None:
        _warn_once(
            why, f"fa4cache: {why} runs through PyTorch SDPA (FA4 path: packed and padded training/prefill)"
        )
        return _sdpa(q, k, v, attention_mask, scaling, sliding_window, causal), None
    window = sliding_window - 1 if sliding_window is not None and sliding_window < q.shape[1] else None
    mask = step_mask(
        batch=q.shape[0],
        seqlen=q.shape[1],
        causal=causal,
        window=window,
        cu_seqlens=cu,
        max_seqlen=_host_int(_first_kwarg(kwargs, "max_length_q", "max_seqlen_q")),
        position_ids=kwargs.get("position_ids"),
        padding=attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None,
    )
    return fa4cache.attention(q, k, v, mask, softmax_scale=scaling), None


def _key_of(t: Any) -> tuple[Any, ...]:
    return (id(t), t._version) if t is not None else (None,)


def step_mask(
    *,
    batch: int,
    seqlen: int,
    causal: bool,
    window: int | None,
    cu_seqlens: Any = None,
    max_seqlen: int | None = None,
    position_ids: Any = None,
    padding: Any = None,
) -> Any:
    """The document mask of one forward step, built once and reused by every layer
    (cached on the identity and version of the tensors it comes from)."""
    import torch

    src = cu_seqlens if cu_seqlens is not None else (padding if padding is not None else position_ids)
    # A mask built outside a CUDA-graph capture must not be reused inside one: the graph
    # would replay with that mask's buffers, never recomputing them for a new packing.
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    key = (_key_of(src), batch, seqlen, causal, window, max_seqlen, capturing)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0]() is src:
            return hit[1]
    mask = _build(batch, seqlen, causal, window, cu_seqlens, max_seqlen, position_ids, padding)
    with _lock:
        if len(_cache) > 8:  # a step uses one or two (full and sliding layers)
            _cache.clear()
        if src is not None:
            _cache[key] = (weakref.ref(src), mask)
    return mask


def _build(
    batch: int,
    seqlen: int,
    causal: bool,
    window: int | None,
    cu: Any,
    max_seqlen: int | None,
    position_ids: Any,
    padding: Any,
) -> Any:
    import torch

    from fa4cache.masks import make_document_mask

    opts: dict[str, Any] = {
        "causal": causal,
        "window": window,
        "block_sparse": False,
        "max_seqlen": max_seqlen,
    }
    if cu is not None:
        cu = cu.reshape(-1)
        if batch == 1:
            return make_document_mask(cu, seqlen=seqlen, validate=False, **opts)
        # Offsets over the flattened batch: each row also starts a document.
        pos = torch.arange(batch * seqlen, device=cu.device)
        ids = torch.searchsorted(cu[1:].contiguous(), pos, right=True).view(batch, seqlen)
        return make_document_mask(
            document_ids=ids, validate=False, max_documents=cu.numel() - 1 + batch, **opts
        )
    if padding is not None:
        # Padding is a document of its own at either end: text never sees it.
        ids = padding.to(torch.int64).diff(dim=1, prepend=padding[:, :1].to(torch.int64)).ne(0).cumsum(1)
        return make_document_mask(document_ids=ids, validate=False, max_documents=3 * batch, **opts)
    if position_ids is None:
        raise ValueError(
            "fa4cache attention: no position_ids, cu_seq_lens_q or attention mask to find documents in"
        )
    pid = position_ids.expand(batch, seqlen)
    starts = torch.ones_like(pid, dtype=torch.bool)
    starts[:, 1:] = pid[:, 1:] != pid[:, :-1] + 1
    ids = starts.cumsum(1)
    limit = _options["max_documents"]
    if limit is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "fa4cache attention: CUDA-graph capture with documents from position_ids needs "
                "fa4cache.adapters.transformers.register(max_documents=N), or cu_seq_lens_q in the batch "
                "(DataCollatorWithFlattening(return_flash_attn_kwargs=True))"
            )
        limit = int(starts.sum())  # one sync per step: the mask is shared by every layer
    return make_document_mask(document_ids=ids, validate=False, max_documents=limit, **opts)


def _sdpa(
    q: Any, k: Any, v: Any, attention_mask: Any, scale: float | None, sliding_window: int | None, causal: bool
) -> Any:
    """The fallback: SDPA with an explicit boolean mask (bottom-right causal for a cache)."""
    import torch

    B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
    if attention_mask is not None and attention_mask.dim() == 4:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    else:
        i = torch.arange(Tq, device=q.device).view(Tq, 1) + (Tk - Tq)
        j = torch.arange(Tk, device=q.device).view(1, Tk)
        allowed = (j <= i) if causal else torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
        if sliding_window is not None:
            allowed = allowed & (j > i - sliding_window)
        allowed = allowed.view(1, 1, Tq, Tk)
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, -Tk:].bool().view(B, 1, 1, Tk)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed, scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )  # fmt: skip
    return out.transpose(1, 2)


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
