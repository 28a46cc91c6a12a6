"""The decode path's torch custom ops: ``torch.ops.fa4cache.kv_cache_attention`` (a KV-cache
step, :func:`.kv_cache.forward`) and ``varlen_kv_attention`` (continuous batching,
:func:`.paged.varlen_forward`), registered on first use."""

from __future__ import annotations

from typing import Any

from .kv_cache import forward
from .paged import varlen_forward

_OPS: list[Any] = []
_LIB: list[Any] = []


def op() -> Any:
    """``torch.ops.fa4cache.kv_cache_attention``, defined on first use: one opaque node to
    ``torch.compile`` (transformers compiles static-cache decoding), so FA4's Python
    interface never meets the tracer and a CUDA graph captures the FA4 launch as is."""
    if not _OPS:
        import torch

        _LIB.append(torch.library.Library("fa4cache", "FRAGMENT"))
        name = "fa4cache::kv_cache_attention"
        torch.library.define(
            name,
            "(Tensor query, Tensor key, Tensor value, Tensor? attention_mask, Tensor? position_ids, "
            "bool causal, int? window, float softmax_scale, float softcap, bool check_mask=True) -> Tensor",
            lib=_LIB[0],
            tags=(torch.Tag.pt2_compliant_tag,),
        )
        torch.library.impl(name, "default", forward, lib=_LIB[0])

        @torch.library.register_fake(name, lib=_LIB[0])
        def _(query, key, value, *rest):  # type: ignore[no-untyped-def]
            B, Hq, Tq, _ = query.shape
            return query.new_empty(B, Tq, Hq, value.shape[-1])

        name = "fa4cache::varlen_kv_attention"
        torch.library.define(
            name,
            "(Tensor query, Tensor key, Tensor value, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "int? max_seqlen_q, int? max_seqlen_k, bool causal, int? window, float softmax_scale, "
            "float softcap) -> Tensor",
            lib=_LIB[0],
            tags=(torch.Tag.pt2_compliant_tag,),
        )
        torch.library.impl(name, "default", varlen_forward, lib=_LIB[0])

        @torch.library.register_fake(name, lib=_LIB[0])
        def _(query, key, value, *rest):  # type: ignore[no-untyped-def]
            return query.new_empty(1, query.shape[2], query.shape[1], value.shape[-1])

        _OPS.append(torch.ops.fa4cache.kv_cache_attention)
        _OPS.append(torch.ops.fa4cache.varlen_kv_attention)
    return _OPS[0]


def varlen_op() -> Any:
    """``torch.ops.fa4cache.varlen_kv_attention`` (:func:`varlen_forward`)."""
    op()
    return _OPS[1]
