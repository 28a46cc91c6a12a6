"""transformers integration: an attention implementation named ``"fa4cache"``.

Two lines in a training script::

    fa4cache.adapters.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa4cache")

What it does, per forward step (the mask is built once and shared by every layer):

* **Packed batches** (``DataCollatorWithFlattening``): documents come from
  ``cu_seq_lens_q``/``cu_seqlens_q`` (either naming, with ``max_length_q``/``max_seqlen_q``)
  or from ``position_ids`` that restart at each document; they run on FA4's varlen
  kernels (per-document tiles) through one custom op per layer
  (:mod:`fa4cache.ops.packed_attention`). A 2-D padding mask becomes documents too (padding never
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
  the cache as it lies (:mod:`fa4cache.decode.kv_cache`), with sliding windows and softcapping, no host
  sync and one kernel per layer kind whatever the batch size or cache length.
* Attention dropout, 4-D masks without document boundaries, KV-cache steps with neither
  a 2-D mask nor ``position_ids``, gradients through a KV-cache step, attention sinks
  (gpt-oss's ``s_aux``) and a position bias (T5's ``position_bias``) run through
  PyTorch with one warning naming the reason; they never crash. In training and
  prefill that fallback applies the step's own document mask, so packed documents stay
  apart there too; softcapping, dropout, sinks and the bias are applied as transformers'
  eager attention does (continuous batching with sinks or a bias is refused by name).

Host syncs: none with ``cu_seq_lens`` or a 2-D padding mask, or with ``position_ids`` when
``register(max_documents=N)`` bounds the documents per step (what CUDA-graph capture needs);
otherwise the documents of a step are counted once (one sync per step, not per layer).
An eager decode step of one row reads its mask once, as sdpa does: without padding it runs
on sdpa's kernel (:mod:`fa4cache.decode.one_row_sdpa`). transformers itself checks
``position_ids`` for packing once per forward in eager mode.

``register()`` also makes transformers' own ``"flash_attention_4"`` path take packed
batches: transformers passes the longest document as a 0-d tensor, which FA4's forward
cannot take as a Python int; the wrapper passes ``None`` instead (FA4 then bounds by the
total, without a sync).
"""

from __future__ import annotations

import functools
from typing import Any

import fa4cache
from fa4cache.decode import op as decode_op
from fa4cache.ops import packed_attention
from fa4cache.ops.step_mask import set_max_documents

from . import model_load
from .attention import attention_forward
from .common import NAME, NAMES, warn_while_tracing_too
from .common import warned as _warned  # noqa: F401  (tests clear it)
from .fallback import fallback as _fallback  # noqa: F401
from .generation import allow_continuous_batching
from .masks import padding_mask
from .models import read_layer_causality, refuse_models_outside_the_interface

__all__ = ["NAME", "attention_forward", "padding_mask", "register"]


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
    model_load.watch_model_loads()
    packed_attention.op()
    decode_op.op()
    # (5.2x deprecates the "paged|" prefix: plain "fa4cache" is the name for generate_batch on both.)
    for name in NAMES:
        AttentionInterface.register(name, attention_forward)
        AttentionMaskInterface.register(name, padding_mask)
    allow_continuous_batching()
    refuse_models_outside_the_interface()
    read_layer_causality()
    warn_while_tracing_too()
    if fix_flash_attention_4:
        _fix_flash_attention_4()


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
