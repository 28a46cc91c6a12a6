"""A KV-cache step (decode, and prefill into a static cache) run as its :class:`.choose.Choice`
says: FA4 over the step's key ranges (eager, or the body of the custom op
``torch.ops.fa4cache.kv_cache_attention``, :mod:`.op`), split-KV, or PyTorch's SDPA.

transformers hands the attention ``query [B, Hq, Tq, D]`` and the whole cache
``key``/``value [B, Hkv, Tk, D]`` (Tk: the tokens so far for a dynamic cache, the buffer
length for a static one), stored head-major. FA4's varlen keys are token-major
(``[tokens, heads, D]``), which the cache is not: making it so would copy the whole cache
in every layer of every step. Instead each (row, KV head) pair is one FA4 sequence with a
single KV head and its ``Hq / Hkv`` query heads (grouped-query attention as MQA): the cache
is then ``[B * Hkv * Tk, 1, D]`` as it lies (a view), the query ``[B * Hkv, Tq, Hq / Hkv,
D]`` (a view when ``Tq == 1``). Each sequence's keys are its row's run of tokens
(:mod:`.key_ranges`); FA4 aligns the queries bottom-right to the last key (causal and
sliding windows as in training), and left-padding queries of a prefill get no keys (output 0).

No host sync: ``max_seqlen_q``/``max_seqlen_k`` are the tensors' shapes. FA4's compile key
does not see the batch size or cache length (a dense query has no varlen scheduler;
``max_seqlen_q`` only splits decode (``Tq * Hq / Hkv`` within one tile) from prefill), so
decoding compiles one kernel per layer kind.

Eager decoding's host time: the step's key ranges are computed once per step and kind of
layer (:mod:`.step_ranges`), each FA4 launch is replayed from its plan (:mod:`.launch_plans`),
and the later layers of a step launch from the step's lane of their kind (:mod:`.lanes`)
without the plan's lookups.
"""

from __future__ import annotations

from typing import Any

from . import lanes, launch, one_row_sdpa, split_kv, step_ranges
from .choose import Choice, Strategy, choose


def _query_view(query: Any, B: int, Hkv: int, g: int, Tq: int, D: int) -> Any:
    """``query [B, Hq, Tq, D]`` as ``[B * Hkv, Tq, g, D]``: at one query a single view of
    transformers' layout (the same strides as the general form, in one op of three: host time
    in every layer of a decode step)."""
    if Tq == 1:
        try:
            return query.view(B * Hkv, 1, g, D)
        except RuntimeError:  # a layout no view reaches: the general form (copies)
            pass
    return query.view(B, Hkv, g, Tq, D).transpose(2, 3).reshape(B * Hkv, Tq, g, D)


def forward(
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    position_ids: Any,
    causal: bool,
    window: int | None,
    softmax_scale: float,
    softcap: float,
    check_mask: bool = True,
    share: bool = False,
    chosen: Choice | None = None,
) -> Any:
    """``[B, Tq, Hq, Dv]`` for ``query [B, Hq, Tq, D]`` and the cache ``key``/``value``
    ``[B, Hkv, Tk, D]``; ``window``: keys before the query's position (transformers'
    ``sliding_window - 1``), None for none; ``softcap`` 0 for none; ``check_mask``: check
    that the mask is one run per row (once per step is enough: every layer gets the same
    rows); ``share``: eager callers only (:func:`.step_ranges.sequences`, :mod:`.lanes`);
    ``chosen``: the step's strategy, where the caller chose it (any but the op), else chosen
    here (the op's body, or an eager call of ``share``)."""
    if chosen is None:
        chosen = choose(query, key, value, attention_mask, window, softcap, eager=share)
    strategy = chosen.strategy
    if strategy is Strategy.ONE_ROW_SDPA:
        return one_row_sdpa.forward(query, key, value, softmax_scale)
    B, Hq, Tq, D = query.shape
    Hkv, Tk, Dv = key.shape[1], key.shape[2], value.shape[-1]
    g = Hq // Hkv
    n = B * Hkv
    q = _query_view(query, B, Hkv, g, Tq, D)
    k = key.reshape(n * Tk, 1, D)
    v = value.reshape(n * Tk, 1, Dv)
    # Decoding: FA4 writes the [B, 1, Hq, Dv] result itself (its (row, KV head) order is
    # that tensor's), with the strides the op's shape function promises.
    result = query.new_empty(B, 1, Hq, Dv) if Tq == 1 else None
    buf = result.view(n, 1, g, Dv) if result is not None else query.new_empty(n, Tq, g, Dv)
    scalars = (Tq, softmax_scale, causal, softcap, window, 0 if window is not None else None)
    if strategy is Strategy.SPLIT_KV and result is not None and chosen.split is not None:
        split_kv.forward(
            q, k, v, buf, attention_mask, position_ids, B, Hkv, Tk, chosen.split, scalars, check_mask
        )
        return result
    lane = inputs = None
    if share:
        inputs = lanes._inputs(query, key, value, attention_mask, scalars)
        lane = lanes._lanes.get(window) if strategy is Strategy.LANES else None
        if lane is not None and not lane.serves(
            query, k, v, buf, attention_mask, position_ids, inputs, check_mask
        ):
            lane = None
    if lane is not None:
        lane.launch(q, k, v, buf)
    else:
        cu, used = step_ranges.sequences(
            attention_mask, position_ids, B, Hkv, Tk, check=check_mask, share=share
        )
        _, replay = launch.launch(q, k, v, buf, cu, used, scalars, Tk)
        if inputs is not None:
            src = attention_mask if attention_mask is not None else position_ids
            lanes._keep_lane(window, inputs, src, check_mask, cu, used, replay)
    if result is not None:
        return result
    return buf.view(B, Hkv, Tq, g, Dv).permute(0, 2, 1, 3, 4).reshape(B, Tq, Hq, Dv)
