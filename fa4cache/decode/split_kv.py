"""Split-KV decoding on FA4's varlen kernel, for the compiled decode path (CUDA graphs).

A decode step's FA4 call has one CTA per (row, KV head) sequence: at batch 1 with 4 KV
heads, 4 of the H200's 132 SMs stream every key, and the call takes 29 µs at 2,048 keys
where sdpa's split kernel takes 10 (``benchmarks/results/decode_split_h200.md``). FA4 splits
the keys itself only on sm_100 (``num_splits`` asserts on sm_90), and its combine kernel
faults on the layout below, so the split is made here: each sequence's keys become ``S``
chunks of ``C`` keys, each chunk a varlen sequence of its own (``cu_seqlens_k`` +
``seqused_k``, chunk-major: chunk ``j`` of sequence ``i`` is sequence ``j * n + i``), the
query repeated per chunk; FA4 returns each chunk's output and log-sum-exp, and one Triton
launch (:mod:`.split_kv_triton`; PyTorch off CUDA) weighs them together.

Only the op body splits (``torch.ops.fa4cache.kv_cache_attention``, what torch.compile and
its CUDA graphs run): there the extra launches (the query's copy, the combine) and FA4's own
planning (a split call has no launch plan) are captured once. Under torch.compile without
CUDA graphs they are host time in every layer: set ``FA4CACHE_DECODE_SPLIT=0`` there if
the step is the host's. The eager path, bound by the host, never splits. A chunk
aligned to FA4's key tile; no split under :data:`MIN_KEYS`, above :data:`MAX_HEAD_DIM`, for
windows (a chunk's query would not see its window), or at more than one query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import launch, step_ranges
from .plan import SCALARS

if TYPE_CHECKING:
    from torch import Tensor

# Fewer keys: the unsplit call is already short (the split's two extra launches cost more).
MIN_KEYS = 1024
# FA4's key tile: a chunk holds whole tiles.
CHUNK_ALIGN = 128
# Most chunks per sequence (past 16 the H200 gained nothing: decode_split_probe_h200.md).
MAX_SPLITS = 16
# Largest head dim split (measured at 64 and 128; at 256 FA4's sm_100 kernel choice depends
# on the batch, here S times the rows, which the warm's one call would not cover).
MAX_HEAD_DIM = 128


def plan(sequences: int, keys: int, num_sms: int) -> tuple[int, int] | None:
    """``(S, C)``: ``S`` chunks of ``C`` keys for a decode call of ``sequences`` (row, KV
    head) sequences over ``keys`` cache slots, or None for no split. S is the largest power
    of two up to :data:`MAX_SPLITS` with ``sequences * S`` CTAs on ``num_sms`` SMs, less
    while the last chunk would be empty."""
    if keys < MIN_KEYS or sequences < 1:
        return None
    splits = 1
    while splits * 2 <= MAX_SPLITS and sequences * splits * 2 <= num_sms:
        splits *= 2
    while splits > 1:
        chunk = _ceil(_ceil(keys, splits), CHUNK_ALIGN) * CHUNK_ALIGN
        if (splits - 1) * chunk < keys:
            return splits, chunk
        splits //= 2
    return None


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def combine(parts: Tensor, lse: Tensor, out: Tensor, splits: int) -> None:
    """Write into ``out`` (``[n, 1, g, Dv]``) the attention over every chunk, from each
    chunk's output ``parts`` (``[S * n, 1, g, Dv]``, chunk-major) and log-sum-exp ``lse``
    (``[S * n, g, 1]``, float32; -inf for a chunk without keys): the chunks' outputs weighed
    by ``exp(lse - max)``. A sequence without keys gets 0, as FA4 gives it."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    from fa4cache.extras import triton_runs_on

    if is_fake(parts):  # a cross-compile (fa4cache warm): nothing to compute
        return
    rows, dv = out.shape[0] * out.shape[2], out.shape[-1]
    if type(parts) is torch.Tensor and triton_runs_on(parts):
        import triton

        from . import split_kv_triton as kernels

        kernels.combine[(rows,)](
            parts, lse, out, rows, S=splits, D=dv, BS=triton.next_power_of_2(splits),
            BD=triton.next_power_of_2(dv),
        )  # fmt: skip
        return
    lse = lse.view(splits, rows)
    top = lse.amax(0).nan_to_num(0.0, neginf=0.0)
    w = torch.exp(lse - top)
    total = w.sum(0)
    mixed = (parts.view(splits, rows, dv).float() * w[..., None]).sum(0)
    mixed = mixed / torch.where(total == 0, torch.ones_like(total), total)[:, None]
    out.view(rows, dv).copy_(mixed)


def forward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, attention_mask: Any, position_ids: Any, batch: int, heads_kv: int,
    keys: int, split: tuple[int, int], scalars: tuple[Any, ...], check: bool,
) -> None:  # fmt: skip
    """One decode call (``q [n, 1, g, D]``, writing ``out [n, 1, g, Dv]``) split in chunks
    (this module): FA4 over the chunk sequences, each with its copy of its query
    and its log-sum-exp, then the combine. FA4 runs whole (no launch plan: only the
    compiled path splits, where CUDA graphs capture its host time once)."""
    import torch

    splits, chunk = split
    n, _, g, d = q.shape
    cu, used = step_ranges.sequences(
        attention_mask, position_ids, batch, heads_kv, keys, check=check, split=split
    )
    # A copy (also at one sequence, where the reshape would be a stride-0 view): the query's
    # broadcast dims are in FA4's compile key, so one layout serves every batch.
    queries = q.expand(splits, n, 1, g, d).reshape(splits * n, 1, g, d).contiguous()
    parts = q.new_empty(splits * n, 1, g, out.shape[-1])
    lse = torch.empty(splits * n, g, 1, dtype=torch.float32, device=q.device)
    kwargs = dict(zip(SCALARS, scalars))
    launch._quiet_fa4_forward(
        queries, k, v, cu_seqlens_k=cu, seqused_k=used, max_seqlen_k=chunk, out=parts, lse=lse, **kwargs
    )
    combine(parts, lse, out, splits)
