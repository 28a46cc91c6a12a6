"""Continuous batching's decode steps on FA4: transformers' gathered keys as one varlen call,
and 5.2x's paged step (``block_table``) over FA4's page table."""

from __future__ import annotations

from typing import Any

from . import launch


def varlen_forward(
    query: Any,
    key: Any,
    value: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    causal: bool,
    window: int | None,
    softmax_scale: float,
    softcap: float,
) -> Any:
    """Continuous batching's step (``query [1, Hq, Tq, D]``, ``key``/``value`` ``[1, Hkv,
    Tk, D]``: the step's sequences' new tokens and their whole keys, gathered from the
    paged cache by transformers) as one FA4 varlen call over ``cu_seqlens_q`` and
    ``cu_seqlens_k``; returns ``[1, Tq, Hq, Dv]``. Query rows outside every sequence (the
    batch's padding to a graph size) get 0."""
    import torch

    Hq, D, Hkv, Dv = query.shape[1], query.shape[-1], key.shape[1], value.shape[-1]
    q = query.transpose(1, 2).reshape(-1, Hq, D)
    k = key.transpose(1, 2).reshape(-1, Hkv, D)
    v = value.transpose(1, 2).reshape(-1, Hkv, Dv)
    out = launch._fa4_forward(
        q, k, v, cu_seqlens_q=cu_seqlens_q.to(torch.int32), cu_seqlens_k=cu_seqlens_k.to(torch.int32),
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
        softcap=softcap, window_size_left=window, window_size_right=0 if window is not None else None,
        out=q.new_zeros(q.shape[0], Hq, Dv),
    )  # fmt: skip
    return out.view(1, -1, Hq, Dv)


def paged_forward(
    query: Any,
    key: Any,
    value: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    cu_seqlens_k: Any,
    causal: bool,
    window: int | None,
    softmax_scale: float,
    softcap: float,
) -> Any:
    """A paged decode step as transformers 5.2x calls ``flash_attn_with_kvcache``: ``query``
    ``[1, Hq, N, D]`` and the new ``key``/``value`` ``[1, Hkv, N, D]`` (one token for each of
    N sequences), the pages ``k_cache``/``v_cache`` ``[pages, page_size, Hkv, D]``,
    ``block_table [N, max_pages]`` and ``cu_seqlens_k`` (each sequence's keys, the new one
    included). The new token is written at its position in its page (rows of length 0, the
    padding of a CUDA-graph batch, write back what their slot holds), then one FA4 call
    attends over the pages (FA4's ``page_table``); returns ``[1, N, Hq, Dv]``."""
    import torch

    N, Hq, Dv = query.shape[2], query.shape[1], value.shape[-1]
    page = k_cache.shape[1]
    table = block_table[:N]
    lengths = (cu_seqlens_k[1 : N + 1] - cu_seqlens_k[:N]).to(torch.int32)
    pos = (lengths.long() - 1).clamp(min=0)
    slot = table.long().gather(1, (pos // page)[:, None])[:, 0] * page + pos % page
    valid = (lengths > 0)[:, None, None]
    for cache, new in ((k_cache, key), (v_cache, value)):
        flat = cache.view(-1, *cache.shape[2:])
        tokens = new[0].transpose(0, 1)  # [N, Hkv, D]
        flat.index_put_((slot,), torch.where(valid, tokens.to(flat.dtype), flat[slot]))
    q = query[0].transpose(0, 1).unsqueeze(1)  # [N, 1, Hq, D]
    out = query.new_empty(N, 1, Hq, Dv)
    launch._fa4_forward(
        q, k_cache, v_cache, page_table=table if table.is_contiguous() else table.contiguous(),
        seqused_k=lengths, max_seqlen_q=1, softmax_scale=softmax_scale, causal=causal, softcap=softcap,
        window_size_left=window, window_size_right=0 if window is not None else None, out=out,
    )  # fmt: skip
    return out.view(1, N, Hq, Dv)
