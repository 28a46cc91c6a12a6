"""Attention over a transformers KV cache (decode, and prefill into a static cache) as one
FA4 call, through the custom op ``torch.ops.fa4cache.kv_cache_attention``.

transformers hands the attention ``query [B, Hq, Tq, D]`` and the whole cache
``key``/``value [B, Hkv, Tk, D]`` (Tk: the tokens so far for a dynamic cache, the buffer
length for a static one), stored head-major. FA4's varlen keys are token-major
(``[tokens, heads, D]``), which the cache is not: making it so would copy the whole cache
in every layer of every step. Instead each (row, KV head) pair is one FA4 sequence with a
single KV head and its ``Hq / Hkv`` query heads (grouped-query attention as MQA): the cache
is then ``[B * Hkv * Tk, 1, D]`` as it lies (a view), the query ``[B * Hkv, Tq, Hq / Hkv,
D]`` (a view when ``Tq == 1``).

Which keys a row sees: its cache holds its tokens in order, the last ``Tq`` of them the
step's queries, after ``start`` slots of left padding (and, in a static buffer, before
unused slots). The step's 2-D padding mask (sliced or padded to the layer's keys by
:func:`fa4cache.adapters.transformers.padding_mask`) marks them as one run of True per row; without a mask,
``position_ids[:, -1] + 1`` tokens from slot 0. That becomes ``cu_seqlens_k`` (each
sequence's first key) and ``seqused_k`` (its count); FA4 aligns the queries bottom-right
to the last key (causal and sliding windows as in training), and left-padding queries of a
prefill get no keys (output 0).

No host sync: every length is computed on the device; ``max_seqlen_q``/``max_seqlen_k``
are the tensors' shapes. FA4's compile key does not see the batch size or cache length
(a dense query has no varlen scheduler; ``max_seqlen_q`` only splits decode (``Tq *
Hq / Hkv`` within one tile) from prefill), so decoding compiles one kernel per layer kind.
A mask with more than one run of tokens in a row (a gap, or right padding) is refused on
the device (``torch._assert_async``) rather than attended wrong.

Eager decoding's host time: the step's key ranges are computed once per step and kind of
layer (:func:`sequences`), each FA4 launch is replayed from its plan
(:mod:`.launch_plans`), and the later layers of a step launch from the step's
:class:`_Lane` of their kind without the plan's lookups.
"""

from __future__ import annotations

import weakref
from typing import Any

from fa4cache.errors import quiet_library_warnings
from fa4cache.extras import triton_runs_on

from . import decode_split, launch_plans

_ONE_RUN = (
    "fa4cache: a KV-cache step's attention_mask must be one run of tokens per row "
    "(left padding; no gaps, no right padding); for such masks use attn_implementation='sdpa'"
)


def _fa4_forward(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    """FA4's forward (a seam: the CPU tests put the FA4 stand-in here)."""
    from flash_attn.cute import interface as fi

    return fi._flash_attn_fwd(q, k, v, **kwargs)[0]


def _launch(
    q: Any, k: Any, v: Any, out: Any, cu: Any, used: Any, scalars: tuple[Any, ...], keys: int
) -> tuple[Any, Any]:
    """A KV-cache call's FA4 launch: replayed from its plan after the first call of its kind
    (:mod:`.launch_plans`: FA4's own planning is most of a decode call's host time), else
    :func:`_fa4_forward`. ``scalars`` in :data:`.launch_plans.SCALARS`' order; ``keys``: FA4's
    ``max_seqlen_k``. Writes ``out``; returns it and the replay launched (or None:
    :func:`.launch_plans.launch_replay`)."""
    return launch_plans.launch_replay(_quiet_fa4_forward, (q, k, v, out, cu, used), scalars, keys)


def _quiet_fa4_forward(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    """:func:`_fa4_forward`, CUTLASS's notes on a compile silenced (not the user's to act on)."""
    with quiet_library_warnings():
        return _fa4_forward(q, k, v, **kwargs)


def key_ranges(attention_mask: Any, position_ids: Any, batch: int, *, check: bool = True) -> tuple[Any, Any]:
    """``(start, count)`` (int32 ``[batch]``): each row's tokens are the cache slots
    ``[start, start + count)``, the mask's one run of True (left padding before it, a
    static buffer's unused slots after it); without a mask, ``position_ids[:, -1] + 1``
    tokens from slot 0. ``check``: refuse (on the device) a mask that is not one run per row."""
    import torch

    if attention_mask is None:
        count = (position_ids[..., -1] + 1).to(torch.int32).expand(batch).contiguous()
        return torch.zeros_like(count), count
    m = attention_mask if attention_mask.dtype != torch.bool else attention_mask.to(torch.uint8)
    count = m.sum(1, dtype=torch.int32)
    start = m.argmax(1).to(torch.int32)  # the first 1 (0 for an empty row)
    if check:
        slot = torch.arange(m.shape[1], device=m.device)
        run = (slot >= start[:, None]) & (slot < (start + count)[:, None])
        torch._assert_async((run == m.to(torch.bool)).all(), _ONE_RUN)
    return start, count


def _sequences(
    attention_mask: Any,
    position_ids: Any,
    batch: int,
    heads_kv: int,
    keys: int,
    *,
    check: bool = True,
    split: tuple[int, int] | None = None,
) -> tuple[Any, Any]:
    """``cu_seqlens_k`` (``[B * Hkv + 1]``) and ``seqused_k`` (``[B * Hkv]``) over the cache
    flattened to ``[B * Hkv * Tk]`` slots: one Triton launch for a CUDA mask
    (:func:`key_ranges_triton`), else a few element-wise kernels, where each launch costs
    about as much as the work. ``split``: ``(S, C)``, each sequence's keys in S chunks of C
    (:mod:`.decode_split`; ``S * B * Hkv`` sequences, chunk-major)."""
    import torch

    if _triton_ranges(attention_mask):
        return key_ranges_triton(attention_mask, batch, heads_kv, keys, check=check, split=split)
    if split is not None:
        cu, used = _sequences(attention_mask, position_ids, batch, heads_kv, keys, check=check)
        return decode_split.chunks(cu, used, *split)
    start, count = key_ranges(attention_mask, position_ids, batch, check=check)
    if attention_mask is None or attention_mask.shape[1] > keys:
        # Without a mask (or one wider than the keys), a sliding cache holds fewer than all
        # tokens so far; a mask as wide as the keys bounds its run itself.
        count = torch.minimum(count, keys - start).clamp_(min=0)
    cu = torch.arange(0, (batch * heads_kv + 1) * keys, keys, device=start.device, dtype=torch.int32)
    # Each row's value for each of its KV heads (an expand: no output size to read back).
    cu[:-1] += start[:, None].expand(batch, heads_kv).reshape(-1)
    # FA4 asserts dense offsets: at batch 1 the reshape of an expand is a stride-0 view.
    return cu, count[:, None].expand(batch, heads_kv).reshape(-1).contiguous()


def _triton_ranges(attention_mask: Any) -> bool:
    """Whether a step's mask gets its key ranges from the one-launch Triton kernel: a real
    CUDA tensor (the first layer's dozen small PyTorch ops cost ~250 µs of host time on an
    H200 host, a decode step's whole attention budget), where
    :func:`fa4cache.extras.triton_runs_on` says."""
    import torch

    return type(attention_mask) is torch.Tensor and triton_runs_on(attention_mask)


def key_ranges_triton(
    attention_mask: Any,
    batch: int,
    heads_kv: int,
    keys: int,
    *,
    check: bool = True,
    split: tuple[int, int] | None = None,
) -> tuple[Any, Any]:
    """:func:`_sequences` for a 2-D mask, in one Triton launch (the same values as the PyTorch
    form; a mask that is not one run per row is refused on the device as there)."""
    import torch
    import triton

    from . import key_ranges_triton as kernels

    n = batch * heads_kv
    splits, chunk = split if split is not None else (1, keys)
    dev = attention_mask.device
    cu = torch.empty(splits * n + 1, dtype=torch.int32, device=dev)
    used = torch.empty(splits * n, dtype=torch.int32, device=dev)
    ok = torch.empty(batch if check else 1, dtype=torch.int32, device=dev)
    width = attention_mask.shape[1]
    kernels.key_ranges[(batch,)](
        attention_mask, *attention_mask.stride(), width, keys, heads_kv, cu, used, ok, n, chunk,
        CHECK=check, BLOCK=min(kernels.BLOCK, triton.next_power_of_2(max(width, 16))),
        HEADS=triton.next_power_of_2(heads_kv), SPLITS=splits,
    )  # fmt: skip
    if check:
        torch._assert_async(ok.all(), _ONE_RUN)
    return cu, used


# The step's (cu_seqlens_k, seqused_k), shared by the layers of one decode step: key ->
# (weak reference to the mask or position_ids it was computed from, checked, value). Every layer of a
# step gets the same mask tensor (transformers builds it once per forward), so only the first
# layer of each kind pays for it.
_step: dict[tuple[Any, ...], tuple[Any, bool, tuple[Any, Any]]] = {}


def _tensor_key(t: Any) -> tuple[Any, ...]:
    return (t.data_ptr(), t.device, tuple(t.shape), tuple(t.stride()), t.dtype, t._version)


def _shareable(src: Any) -> bool:
    """Whether a step's lengths may be kept for the next layer: not while torch.compile traces
    (fake tensors), nor for an inference tensor (it has no version to check), nor while a CUDA graph captures (a value kept between calls would stay
    alive in a CUDA-graph tree's memory pool without being one of the graph's outputs, which
    torch.compile's cudagraphs refuse; and a hand-captured graph must compute its own)."""
    import torch

    if torch.compiler.is_compiling():
        return False
    if src.is_inference():  # no version counter (inference_mode): a change in place would not be seen
        return False
    return not (src.is_cuda and torch.cuda.is_current_stream_capturing())


def sequences(
    attention_mask: Any,
    position_ids: Any,
    batch: int,
    heads_kv: int,
    keys: int,
    *,
    check: bool = True,
    share: bool = False,
    split: tuple[int, int] | None = None,
) -> tuple[Any, Any]:
    """:func:`_sequences`, computed once per decode step and kind of layer in eager mode: the
    layers after the first reuse it while the mask (or ``position_ids``) is the same tensor,
    unchanged (its storage, layout and version, and alive: a weak reference). ``share``: the
    caller is eager code (the adapter's direct call), never the custom op, whose body runs
    inside torch.compile's CUDA-graph trees (their warm-up runs in the graphs' pool)."""
    src = attention_mask if attention_mask is not None else position_ids
    if not share or src is None or not _shareable(src):
        return _sequences(attention_mask, position_ids, batch, heads_kv, keys, check=check, split=split)
    key = (_tensor_key(src), attention_mask is None, batch, heads_kv, keys, split)
    hit = _step.get(key)
    if hit is not None and hit[0]() is src and (hit[1] or not check):
        return hit[2]
    value = _sequences(attention_mask, position_ids, batch, heads_kv, keys, check=check, split=split)
    while len(_step) >= 8:  # a step has one or two kinds of layer (full and sliding)
        del _step[next(iter(_step))]  # the oldest: never the current step's other kind
    _step[key] = (weakref.ref(src), check, value)
    return value


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
) -> Any:
    """``[B, Tq, Hq, Dv]`` for ``query [B, Hq, Tq, D]`` and the cache ``key``/``value``
    ``[B, Hkv, Tk, D]``; ``window``: keys before the query's position (transformers'
    ``sliding_window - 1``), None for none; ``softcap`` 0 for none; ``check_mask``: check
    that the mask is one run per row (once per step is enough: every layer gets the same
    rows); ``share``: eager callers only (:func:`sequences`, :class:`_Lane`)."""
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
    if not share and result is not None and window is None:
        split = split_plan(n, Tk, max(D, Dv))
        if split is not None:
            _split_forward(q, k, v, buf, attention_mask, position_ids, B, Hkv, Tk, split, scalars, check_mask)
            return result
    lane = inputs = None
    if share:
        inputs = _inputs(query, key, value, attention_mask, scalars)
        lane = _lanes.get(window)
        if lane is not None and not lane.serves(query, k, v, buf, attention_mask, position_ids, inputs, check_mask):
            lane = None
    if lane is not None:
        lane.launch(q, k, v, buf)
    else:
        cu, used = sequences(attention_mask, position_ids, B, Hkv, Tk, check=check_mask, share=share)
        _, replay = _launch(q, k, v, buf, cu, used, scalars, Tk)
        if inputs is not None:
            src = attention_mask if attention_mask is not None else position_ids
            _keep_lane(window, inputs, src, check_mask, cu, used, replay)
    if result is not None:
        return result
    return buf.view(B, Hkv, Tq, g, Dv).permute(0, 2, 1, 3, 4).reshape(B, Tq, Hq, Dv)


def split_plan(sequences: int, keys: int, head_dim: int) -> tuple[int, int] | None:
    """:func:`.decode_split.plan` for this device, unless ``FA4CACHE_DECODE_SPLIT=0`` or
    ``head_dim`` (the larger of the query's and the value's) is past
    :data:`.decode_split.MAX_HEAD_DIM`."""
    from fa4cache.arch import num_sms_or_none
    from fa4cache.settings import setting

    # The integer bounds first: this runs in every layer of a compiled step without graphs.
    if head_dim > decode_split.MAX_HEAD_DIM or keys < decode_split.MIN_KEYS:
        return None
    if not setting("FA4CACHE_DECODE_SPLIT"):
        return None
    sms = num_sms_or_none()
    if sms is None:
        return None
    return decode_split.plan(sequences, keys, sms)


def _split_forward(
    q: Any, k: Any, v: Any, out: Any, attention_mask: Any, position_ids: Any, batch: int, heads_kv: int,
    keys: int, split: tuple[int, int], scalars: tuple[Any, ...], check: bool,
) -> None:  # fmt: skip
    """One decode call (``q [n, 1, g, D]``, writing ``out [n, 1, g, Dv]``) split in chunks
    (:mod:`.decode_split`): FA4 over the chunk sequences, each with its copy of its query
    and its log-sum-exp, then the combine. FA4 runs whole (no launch plan: only the
    compiled path splits, where CUDA graphs capture its host time once)."""
    import torch

    splits, chunk = split
    n, _, g, d = q.shape
    cu, used = sequences(attention_mask, position_ids, batch, heads_kv, keys, check=check, split=split)
    # A copy (also at one sequence, where the reshape would be a stride-0 view): the query's
    # broadcast dims are in FA4's compile key, so one layout serves every batch.
    queries = q.expand(splits, n, 1, g, d).reshape(splits * n, 1, g, d).contiguous()
    parts = q.new_empty(splits * n, 1, g, out.shape[-1])
    lse = torch.empty(splits * n, g, 1, dtype=torch.float32, device=q.device)
    kwargs = dict(zip(launch_plans.SCALARS, scalars))
    _quiet_fa4_forward(
        queries, k, v, cu_seqlens_k=cu, seqused_k=used, max_seqlen_k=chunk, out=parts, lse=lse, **kwargs
    )
    decode_split.combine(parts, lse, out, splits)


def _inputs(query: Any, key: Any, value: Any, attention_mask: Any, scalars: tuple[Any, ...]) -> tuple[Any, ...]:
    """What :func:`forward` derives FA4's call from, but the tensors' addresses and the
    mask's values: each input's type, shape, strides, dtype, device and grad flag, whether
    a mask (or ``position_ids``) gives the keys, and the scalars. Written out: host time in
    every decode layer."""
    return (
        type(query), query.shape, query.stride(), query.dtype, query.device, query.requires_grad,
        type(key), key.shape, key.stride(), key.dtype, key.device, key.requires_grad,
        type(value), value.shape, value.stride(), value.dtype, value.device, value.requires_grad,
        attention_mask is None, scalars,
    )  # fmt: skip


class _Lane:
    """An eager decode call whose launch was replayed (:func:`.launch_plans.launch_replay`),
    kept for the next layers of its kind in the same step. Their calls differ from it only
    in their tensors' addresses: :func:`forward` derives FA4's tensors from its inputs
    alone (views of them, or copies and buffers of a layout their shapes and strides
    fix), so a call with equal :func:`_inputs` and the same mask (or ``position_ids``)
    tensor, unchanged, is a call of the same launch family, with the same key ranges.
    What the family holds besides (FA4's state, the alignment and distinctness of the
    tensors' addresses) is checked per call. The family's lookups (each tensor's facts
    and the plan's kernel) are then made once per step and kind of layer, not per layer.
    Never made from inputs that need a gradient, nor from an inference tensor's mask. Like
    :func:`sequences`, it sees a mask's changes through torch (its version), not writes
    behind torch's back (``.data``, DLPack or NumPy aliases)."""

    __slots__ = ("inputs", "src", "src_key", "checked", "cu", "used", "replay", "others")

    def __init__(self, inputs: tuple[Any, ...], src: Any, checked: bool, cu: Any, used: Any, replay: Any) -> None:
        self.inputs, self.src, self.src_key, self.checked = inputs, weakref.ref(src), _tensor_key(src), checked
        self.cu, self.used, self.replay = cu, used, replay
        self.others = (cu.data_ptr(), used.data_ptr())

    def launch(self, q: Any, k: Any, v: Any, out: Any) -> None:
        self.replay.launch((q, k, v, out, self.cu, self.used))

    def serves(
        self, query: Any, k: Any, v: Any, out: Any, attention_mask: Any, position_ids: Any,
        inputs: tuple[Any, ...], check: bool,
    ) -> bool:  # fmt: skip
        src = attention_mask if attention_mask is not None else position_ids
        if src is None or self.src() is not src or inputs != self.inputs or (check and not self.checked):
            return False
        if not _shareable(src) or _tensor_key(src) != self.src_key or not self.replay.current():
            return False
        p0, p1, p2, p3 = query.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        # The family's usual call (launch_plans.family): six addresses, none alike, all on the
        # grid (q is a view of query: the same address).
        return len({p0, p1, p2, p3, *self.others}) == 6 and not (p0 | p1 | p2 | p3) % launch_plans.ALIGNMENT


# Per layer kind (its window): the last eager decode call that was replayed (_Lane).
_lanes: dict[Any, _Lane] = {}


def _keep_lane(
    window: int | None, inputs: tuple[Any, ...], src: Any, checked: bool, cu: Any, used: Any, replay: Any
) -> None:
    # Inputs that need a gradient: whether FA4's tensors need one depends on the grad mode,
    # which the inputs do not hold (a copy made under no_grad needs none).
    if replay is None or src is None or not _shareable(src) or inputs[5] or inputs[11] or inputs[17]:
        _lanes.pop(window, None)
        return
    if len(_lanes) >= 8 and window not in _lanes:
        _lanes.clear()
    _lanes[window] = _Lane(inputs, src, checked, cu, used, replay)


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
    out = _fa4_forward(
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
    _fa4_forward(
        q, k_cache, v_cache, page_table=table if table.is_contiguous() else table.contiguous(),
        seqused_k=lengths, max_seqlen_q=1, softmax_scale=softmax_scale, causal=causal, softcap=softcap,
        window_size_left=window, window_size_right=0 if window is not None else None, out=out,
    )  # fmt: skip
    return out.view(1, N, Hq, Dv)


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
