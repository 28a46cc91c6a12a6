"""A decode step's key ranges: which cache slots each (row, KV head) sequence's keys are,
as FA4's ``cu_seqlens_k`` (each sequence's first key) and ``seqused_k`` (its count).

Which keys a row sees: its cache holds its tokens in order, the last ``Tq`` of them the
step's queries, after ``start`` slots of left padding (and, in a static buffer, before
unused slots). The step's 2-D padding mask (sliced or padded to the layer's keys by
:func:`fa4cache.adapters.transformers.padding_mask`) marks them as one run of True per row;
without a mask, ``position_ids[:, -1] + 1`` tokens from slot 0. A mask with more than one
run of tokens in a row (a gap, or right padding) is refused on the device
(``torch._assert_async``) rather than attended wrong. No host sync: every length is
computed on the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fa4cache.extras import triton_runs_on

if TYPE_CHECKING:
    from torch import Tensor

_ONE_RUN = (
    "fa4cache: a KV-cache step's attention_mask must be one run of tokens per row "
    "(left padding; no gaps, no right padding); for such masks use attn_implementation='sdpa'"
)


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
    (:func:`chunks`; ``S * B * Hkv`` sequences, chunk-major)."""
    import torch

    if _triton_ranges(attention_mask):
        return key_ranges_triton(attention_mask, batch, heads_kv, keys, check=check, split=split)
    if split is not None:
        cu, used = _sequences(attention_mask, position_ids, batch, heads_kv, keys, check=check)
        return chunks(cu, used, *split)
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


def chunks(cu: Tensor, used: Tensor, splits: int, chunk: int) -> tuple[Tensor, Tensor]:
    """Unsplit ``(cu_seqlens_k, seqused_k)`` of ``n`` sequences as ``splits * n`` chunk
    sequences, chunk-major (the PyTorch form of the Triton kernel's ``SPLITS``; split-KV decoding, :mod:`.split_kv`): chunk ``j``
    starts ``j * chunk`` keys into its sequence's run (at the run's end once past it) and
    holds at most ``chunk`` of them."""
    import torch

    n = used.shape[0]
    lo = torch.arange(splits, device=used.device, dtype=torch.int32).view(splits, 1) * chunk
    run = used.view(1, n)
    starts = (cu[:-1].view(1, n) + torch.minimum(lo, run)).reshape(-1)
    parts = (run - lo).clamp(0, chunk).reshape(-1)
    return torch.cat((starts, cu[-1:])).to(torch.int32), parts.to(torch.int32).contiguous()
