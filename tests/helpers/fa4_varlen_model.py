"""A CPU model of FA4's varlen calls: which (query, key) pairs a call computes, and a float
forward/backward with the signatures and output layouts of
:mod:`fa4cache.ops.varlen_calls` (``out [n, Hq, Dv]``, ``lse [Hq, n]``), for tests
that run the adapters' real plumbing where FA4 itself cannot run."""

from __future__ import annotations

from typing import Any

import torch


def sequence_rows(cu: Any, used: Any, n: int) -> tuple[Any, Any]:
    """Per flattened token: its sequence (-1 if none) and local index, FA4's reading of
    ``cu_seqlens`` + ``seqused``."""
    cu = cu.long()
    lens = cu[1:] - cu[:-1] if used is None else used.long()
    seq = torch.full((n,), -1, dtype=torch.long)
    local = torch.zeros(n, dtype=torch.long)
    for i in range(lens.numel()):
        a, b = int(cu[i]), int(cu[i]) + int(lens[i])
        assert b <= n and bool((seq[a:b] == -1).all()), "sequences of one call overlap"
        seq[a:b] = i
        local[a:b] = torch.arange(b - a)
    return seq, local


def call_pairs(call: Any, n: int) -> Any:
    """The [n, n] (query, key) pairs one FA4 varlen call computes (bottom-right aligned)."""
    sq, mq = sequence_rows(call.cu_seqlens_q, call.seqused_q, n)
    sk, mk = sequence_rows(call.cu_seqlens_k, call.seqused_k, n)
    lq = torch.bincount(sq[sq >= 0], minlength=call.cu_seqlens_q.numel())
    lk = torch.bincount(sk[sk >= 0], minlength=call.cu_seqlens_k.numel())
    shift = (lk - lq)[sq.clamp(min=0)].view(-1, 1)  # seqlen_k - seqlen_q of the query's sequence
    m, k = mq.view(-1, 1) + shift, mk.view(1, -1)
    keep = (sq.view(-1, 1) == sk.view(1, -1)) & (sq.view(-1, 1) >= 0)
    left, right = call.window_size
    if call.causal:
        keep &= k <= m
    if left is not None:
        keep &= k >= m - left
    if right is not None:
        keep &= k <= m + right
    return keep, sq >= 0


def capped(s: Any, softcap: float) -> Any:
    """FA4's softcap score_mod on scaled scores: ``cap * tanh(s / cap)``."""
    return softcap * torch.tanh(s / softcap) if softcap else s


def mask_reference(
    q: Any, k: Any, v: Any, mask: Any, *, softmax_scale: float | None = None, softcap: float = 0.0
) -> Any:
    """Attention of ``[B, T, H, D]`` tensors under ``mask.dense()``, in float (differentiable):
    the reference any path of ``fa4cache.attention`` is held to."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    s = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * (softmax_scale or q.shape[-1] ** -0.5)
    s = capped(s, softcap).masked_fill(~mask.dense()[:, None], float("-inf"))
    return torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v.float()).to(q.dtype)


def layout_pairs(calls: Any, n: int) -> Any:
    """The [n, n] pairs of all the calls of a layout (their query rows are disjoint)."""
    keep = torch.zeros(n, n, dtype=torch.bool)
    for call in calls:
        keep |= call_pairs(call, n)[0]
    return keep


def _probabilities(
    q: Any, k: Any, calls: Any, scale: float | None, lse: Any = None, softcap: float = 0.0
) -> tuple[Any, Any]:
    n, hq, d = q.shape
    kk = k.float().repeat_interleave(hq // k.shape[1], dim=1)
    s = capped(torch.einsum("qhd,khd->hqk", q.float(), kk) * (scale or d**-0.5), softcap)
    s = s.masked_fill(~layout_pairs(calls, n), float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)
    # A row with no keys (FA4: output 0) has lse -inf and would be nan.
    return torch.exp(s - lse[..., None]).nan_to_num(0.0), lse


def forward(
    q: Any, k: Any, v: Any, calls: Any, softmax_scale: float | None, softcap: float = 0.0
) -> tuple[Any, Any]:
    p, lse = _probabilities(q, k, calls, softmax_scale, softcap=softcap)
    vv = v.float().repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return torch.einsum("hqk,khd->qhd", p, vv).to(q.dtype), lse


def backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    dout: Any,
    lse: Any,
    calls: Any,
    softmax_scale: float | None,
    softcap: float = 0.0,
) -> tuple[Any, Any, Any]:
    # Written out rather than autograd: inside a custom op, autograd does not record.
    n, hq, d = q.shape
    hk = k.shape[1]
    group = hq // hk
    scale = softmax_scale or d**-0.5
    p, _ = _probabilities(q, k, calls, softmax_scale, lse, softcap)
    kk, vv = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    do = dout.float()
    dv = torch.einsum("hqk,qhd->khd", p, do)
    dp = torch.einsum("qhd,khd->hqk", do, vv)
    delta = (do * out.float()).sum(-1).transpose(0, 1)
    ds = p * (dp - delta[..., None])
    if softcap:  # through cap * tanh(s / cap): times 1 - tanh^2
        raw = torch.einsum("qhd,khd->hqk", q.float(), kk) * scale
        ds = ds * (1 - torch.tanh(raw / softcap) ** 2)
    dq = torch.einsum("hqk,khd->qhd", ds, kk) * scale
    dk = torch.einsum("hqk,qhd->khd", ds, q.float()) * scale
    dk, dv = (t.view(n, hk, group, -1).sum(2) for t in (dk, dv))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def flash_attn_fwd(
    q: Any,
    k: Any,
    v: Any,
    *,
    cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None,
    seqused_k: Any = None,
    page_table: Any = None,
    max_seqlen_q: Any = None,
    max_seqlen_k: Any = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    softcap: float | None = 0.0,
    window_size_left: int | None = None,
    window_size_right: int | None = None,
    out: Any = None,
    lse: Any = None,
) -> tuple[Any, Any]:
    """FA4's ``_flash_attn_fwd`` for the key layouts of KV-cache attention, in float:
    ``(out, lse)``. Queries: dense ``[N, Tq, Hq, D]`` or flat ``[total_q, Hq, D]`` with
    ``cu_seqlens_q``. Keys of sequence ``i``: flat ``k[cu_seqlens_k[i]:][:seqused_k[i]]``;
    paged ``k[page_table[i]]`` (``[pages, page_size, Hk, D]``) up to ``seqused_k[i]``; or dense
    ``k[i][:seqused_k[i]]``. Queries align bottom-right to their keys (causal and windows as
    FA4 masks them); a query with no keys gets 0 and lse -inf. A given ``lse`` (float32, FA4's
    layout: ``[N, Hq, Tq]`` dense, ``[Hq, total_q]`` flat) is written as FA4 writes it."""
    if (cu_seqlens_k is not None) + (page_table is not None) > 1:
        raise AssertionError("page_table is not supported with cu_seqlens_k (as in FA4)")
    for t in (cu_seqlens_q, cu_seqlens_k, seqused_k):  # FA4's own input checks
        if t is not None and (t.dtype != torch.int32 or t.stride(0) != 1):
            raise AssertionError("cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be contiguous int32")
    dense_q = cu_seqlens_q is None
    n = q.shape[0] if dense_q else cu_seqlens_q.numel() - 1
    # FA4's shape checks (interface._flash_attn_fwd): one entry per sequence, keys flat
    # [tokens, heads, D] with cu_seqlens_k, and a given `out` exactly the output's shape.
    if cu_seqlens_k is not None and (tuple(cu_seqlens_k.shape) != (n + 1,) or k.dim() != 3):
        raise AssertionError("cu_seqlens_k must have shape (batch_size + 1,)")
    if seqused_k is not None and tuple(seqused_k.shape) != (n,):
        raise AssertionError("seqused_k must have shape (batch_size,)")
    if page_table is not None and (page_table.dtype != torch.int32 or tuple(page_table.shape)[:1] != (n,)):
        raise AssertionError("page_table must be int32 with shape (batch_size, max_num_pages_per_seq)")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise AssertionError("q, k, v, and qv must have the same dtype")
    if out is not None and (tuple(out.shape) != (*q.shape[:-1], v.shape[-1]) or out.dtype != q.dtype):
        raise AssertionError(f"out shape {tuple(out.shape)} != expected {(*q.shape[:-1], v.shape[-1])}")
    if out is None:  # FA4 leaves rows outside every sequence as they were
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    given = lse
    fa4_layout = (q.shape[0], q.shape[2], q.shape[1]) if dense_q else (q.shape[1], q.shape[0])
    if given is not None and (tuple(given.shape) != fa4_layout or given.dtype != torch.float32):
        raise AssertionError(f"lse shape {tuple(given.shape)} != expected {fa4_layout}")
    lse = torch.full(q.shape[:-1], float("-inf"))
    scale = softmax_scale or q.shape[-1] ** -0.5
    for i in range(n):
        rows = slice(None) if dense_q else slice(int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]))
        qi = q[i] if dense_q else q[rows]
        if page_table is not None:
            ki, vi = (t[page_table[i].long()].flatten(0, 1) for t in (k, v))
        elif cu_seqlens_k is not None:
            a = int(cu_seqlens_k[i])
            ki, vi = k[a:], v[a:]
            if seqused_k is None:
                ki, vi = ki[: int(cu_seqlens_k[i + 1]) - a], vi[: int(cu_seqlens_k[i + 1]) - a]
        else:
            ki, vi = k[i], v[i]
        if seqused_k is not None:
            ki, vi = ki[: int(seqused_k[i])], vi[: int(seqused_k[i])]
        lq, lk = qi.shape[0], ki.shape[0]
        pos = torch.arange(lq).view(-1, 1) + (lk - lq)
        j = torch.arange(lk).view(1, -1)
        keep = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            keep &= j <= pos
        if window_size_left is not None:
            keep &= j >= pos - window_size_left
        if window_size_right is not None:
            keep &= j <= pos + window_size_right
        group = qi.shape[1] // ki.shape[1]
        kk, vv = (t.float().repeat_interleave(group, dim=1) for t in (ki, vi))
        s = capped(torch.einsum("qhd,khd->hqk", qi.float(), kk) * scale, softcap or 0.0)
        s = s.masked_fill(~keep, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [h, lq]
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        o = torch.einsum("hqk,khd->qhd", p, vv).to(q.dtype)
        if dense_q:
            out[i], lse[i] = o, row_lse.transpose(0, 1)
        else:
            out[rows], lse[rows] = o, row_lse.transpose(0, 1)
    if given is not None:
        given.copy_(lse.transpose(-1, -2) if dense_q else lse.transpose(0, 1))
    return out, lse


def kv_cache_reference(
    query: Any,
    key: Any,
    value: Any,
    mask: Any,
    position_ids: Any,
    causal: bool,
    window: int | None,
    softmax_scale: float,
    softcap: float = 0.0,
) -> Any:
    """Attention over a KV cache as transformers hands it (``query [B, Hq, Tq, D]``,
    ``key``/``value [B, Hkv, Tk, D]``), in float: a row's keys are the True slots of its
    mask (one run; a mask narrower than the keys is padded with False) or, without one, the slots before
    ``position_ids[:, -1] + 1``; its queries are the run's last ``Tq`` slots (``window``:
    keys before a query's slot). Returns ``[B, Tq, Hq, Dv]``."""
    B, Hq, Tq, _ = query.shape
    Tk = key.shape[2]
    j = torch.arange(Tk)
    if mask is None:
        valid = j[None] < (position_ids[..., -1:] + 1).expand(B, 1)
    else:
        assert mask.shape[1] <= Tk, "a mask wider than the keys (a sliding cache's) is not modelled"
        valid = torch.nn.functional.pad(mask.bool(), (0, Tk - mask.shape[1]))
    end = (valid * (j + 1)).amax(1)  # one past each row's last key
    qslot = (end[:, None] - Tq + torch.arange(Tq)[None])[..., None]  # [B, Tq, 1]
    allowed = valid[:, None, :].expand(B, Tq, Tk)
    if causal or window is not None:  # FA4's window_size_right is 0 with a window
        allowed = allowed & (j <= qslot)
    if window is not None:
        allowed = allowed & (j >= qslot - window)
    group = Hq // key.shape[1]
    kk, vv = (t.float().repeat_interleave(group, dim=1) for t in (key, value))
    s = capped(torch.einsum("bhqd,bhkd->bhqk", query.float(), kk) * softmax_scale, softcap)
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    return torch.einsum("bhqk,bhkd->bqhd", torch.softmax(s, -1).nan_to_num(0.0), vv)
