"""What the FA4 path does not cover, in PyTorch (one warning names the reason)."""

from __future__ import annotations

from typing import Any


def fallback(
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
    sinks: Any = None,
    bias: Any = None,
) -> Any:
    """What the FA4 path does not cover, in PyTorch: ``allowed`` (``[B, 1, Tq, Tk]``
    booleans: the step's document mask) where given, else a mask from ``attention_mask``
    or causal over a cache (:func:`_cache_mask`) with the window. SDPA where it computes the same;
    softcapping, attention dropout, attention sinks (``sinks``: one logit per query head,
    gpt-oss's ``s_aux``, or per head and query, ``[B, Hq, Tq, 1]``) and an additive
    ``bias`` (T5's ``position_bias``, broadcast to ``[B, Hq, Tq, Tk]``) are applied by hand,
    as transformers' eager paths do."""
    import torch

    B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
    if allowed is None and attention_mask is not None and attention_mask.dim() == 4:
        if attention_mask.dtype == torch.bool:
            allowed = attention_mask
        else:
            # transformers' float masks add to the scores: 0 or the dtype's min, or a bias
            # outright (Parakeet's relative positions come as its "mask").
            bias = attention_mask if bias is None else bias + attention_mask
            allowed = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=q.device)
    elif allowed is None:
        allowed = _cache_mask(attention_mask, B, Tq, Tk, causal, sliding_window, q.device)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    if not softcap and not dropout and sinks is None and bias is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, attn_mask=allowed, scale=scale, enable_gqa=q.shape[2] != k.shape[2]
        )
        return out.transpose(1, 2)
    group = q.shape[2] // k.shape[2]
    kt, vt = (t.repeat_interleave(group, dim=1) for t in (kt, vt))
    scores = torch.matmul(qt, kt.transpose(2, 3)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        # The sink is one more logit per query head, in the softmax and then dropped.
        # One per head (gpt-oss's s_aux, [Hq]) or one per head and query ([B, Hq, Tq, 1]).
        sink = sinks.reshape(1, -1, 1, 1) if sinks.dim() == 1 else sinks
        sink = sink.to(scores.dtype).expand(B, scores.shape[1], Tq, 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), dim=-1, dtype=torch.float32)[..., :-1].to(
            q.dtype
        )
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if dropout:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return torch.matmul(probs, vt).transpose(1, 2)


def _cache_mask(
    attention_mask: Any, B: int, Tq: int, Tk: int, causal: bool, window: int | None, device: Any
) -> Any:
    """``[B, 1, Tq, Tk]``: which keys each query sees over a cache. The queries are the last
    ``Tq`` tokens: a 2-D mask marks the keys that hold tokens (left padding before them, a
    static buffer's empty slots after them), so they end at its last True; without one (the
    mask hook makes one for every cache step it sees), the last ``Tq`` of the ``Tk`` keys. A
    query that sees no key (a left-padding query of a prefill) sees all of them, as eager's
    additive mask makes it (a row of zeros would be NaN, and reach the tokens as a value)."""
    import torch

    j = torch.arange(Tk, device=device)
    rows = torch.arange(Tq, device=device)
    if attention_mask is not None:
        valid = attention_mask[:, -Tk:].bool()
        last = (Tk - 1) - valid.flip(1).to(torch.uint8).argmax(1)
        qpos = last.view(-1, 1) - (Tq - 1) + rows.view(1, Tq)
    else:
        qpos = (rows + (Tk - Tq)).view(1, Tq)
        valid = torch.ones(1, Tk, dtype=torch.bool, device=device)
    allowed = valid[:, None, :].expand(-1, Tq, Tk)
    if causal:
        allowed = allowed & (j.view(1, 1, Tk) <= qpos[:, :, None])
    if window is not None:
        allowed = allowed & (j.view(1, 1, Tk) > qpos[:, :, None] - window)
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    return allowed.expand(B, Tq, Tk)[:, None]
