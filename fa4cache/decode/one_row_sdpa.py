"""An eager decode step of one sequence whose mask is all ones, on PyTorch's SDPA kernel.

At one row, an eager step is bound by host time, not by the attention kernel. FA4's launch
from Python (the step's key ranges, then a replayed launch in each layer) costs more host
time per layer than torch's C++ dispatch of its own flash kernel. Measured on the H200
inside ``generate`` (``benchmarks/archive/2026-12-03/results/probe_decode_ranges_h200.md``): 312 µs for the
first layer and 79 µs for each later one, against sdpa's 79 and 47.

So such a step runs as transformers' sdpa runs it, with the same kernel and the same host
syncs:

* a step with a mask: the first layer that can take this path reads the mask back once
  (:func:`all_ones`, one host sync, as sdpa's mask check makes), and the later layers of
  the step reuse the answer;
* a step without a mask (transformers 5.2x's ``generate`` drops an all-ones mask): the
  mask hook knows from the cache's sizes alone that the keys are exactly the tokens so far
  (:func:`mask_for_all_tokens`), and hands the layers a mask of ones, known without a sync.

Every other step stays on FA4: larger batches, padding, sliding windows, softcapping,
static caches, head dims past 256, and steps that torch.compile traces or a CUDA graph
captures. ``FA4CACHE_ONE_ROW_SDPA=0`` keeps these steps on FA4 too. Which step runs here
is :func:`.choose.choose`'s answer.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

# Where FA4 runs (the CPU tests add "cpu": FA4 is a stand-in there, and SDPA is real).
DEVICE_TYPES = ("cuda",)

# SDPA's grouped-query form (enable_gqa) reaches its fused kernels up to this head dim;
# past it transformers' sdpa itself takes another form.
MAX_HEAD_DIM = 256

# What is known of a mask: id -> (a weak reference to the mask, its version then, all ones).
# A mask is a fresh view per forward (the hook slices it), which every layer of that forward gets.
_known: dict[int, tuple[Any, int, bool]] = {}


def applies(mask: Any) -> bool:
    """Whether a mask's step may run here: in eager code (asked first: nothing else is
    traced), a real tensor on FA4's device (a fake one is a trace), outside CUDA-graph
    capture, not an inference tensor (it has no version to check), with the setting on."""
    import torch

    from fa4cache.settings import decode_switches

    if torch.compiler.is_compiling():
        return False
    if type(mask) is not torch.Tensor or mask.device.type not in DEVICE_TYPES or mask.is_inference():
        return False
    if mask.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return decode_switches().one_row_sdpa


def _keep(mask: Any, ones: bool) -> bool:
    if len(_known) >= 64:  # masks of finished steps whose ids were not reused
        _known.clear()
    _known[id(mask)] = (weakref.ref(mask), mask._version, ones)
    return ones


def not_all_ones(mask: Any) -> Any:
    """``mask``, known to hold a False without reading it (the mask hook's slots of a static
    buffer: its later slots are empty), so that :func:`all_ones` costs no sync for it."""
    import torch

    if (
        not torch.compiler.is_compiling()
        and mask.dim() == 2
        and mask.shape[0] == 1
        and not mask.is_inference()
    ):
        _keep(mask, False)  # (an inference tensor has no version to keep the answer by)
    return mask


def all_ones(mask: Any) -> bool:
    """Whether a one-row step's 2-D ``mask`` is all ones: the answer kept for this mask
    object while it lives unchanged (its version), else read from the device (one host
    sync) and kept, True or False. False where this path does not apply. Eager code only:
    the answer is found by the object's id."""
    hit = _known.get(id(mask))
    if hit is not None and hit[0]() is mask and hit[1] == mask._version:
        return hit[2]
    if mask.dim() != 2 or mask.shape[0] != 1 or not applies(mask):
        return False
    return _keep(mask, bool(mask.all()))


def mask_for_all_tokens(
    batch: int, q_length: int, kv_length: int, q_offset: Any, kv_offset: Any, device: Any
) -> Any:
    """A mask of ones for a one-row decode step given no mask (None where not): when the
    cache's sizes say its keys are exactly the tokens so far (a dynamic cache: an int query
    offset, the keys from slot 0, as many as the tokens before the step and in it), every
    key is a token, and this path may run without reading anything back. A static cache's
    offset is a tensor, a sliding cache's keys start later: neither is made one."""
    import torch

    if batch != 1 or q_length != 1 or device is None or isinstance(q_offset, bool):
        return None
    if torch.compiler.is_compiling():  # traced: nothing made (applies() would refuse it anyway)
        return None
    if not isinstance(q_offset, int) or q_offset < 1 or kv_offset != 0 or kv_length != q_offset + q_length:
        return None
    if torch.device(device).type not in DEVICE_TYPES:
        return None
    mask = torch.ones(1, kv_length, dtype=torch.bool, device=device)
    if not applies(mask):
        return None
    _keep(mask, True)
    return mask


def takes(query: Tensor, key: Tensor, value: Tensor) -> bool:
    """Whether SDPA's grouped-query call serves these shapes as transformers' sdpa would
    (equal query and value head dims up to :data:`MAX_HEAD_DIM`)."""
    return query.shape[-1] == value.shape[-1] <= MAX_HEAD_DIM and key.shape[-1] == query.shape[-1]


def forward(query: Tensor, key: Tensor, value: Tensor, scale: float) -> Tensor:
    """``[1, 1, Hq, Dv]`` for ``query [1, Hq, 1, D]`` over every key of ``key``/``value``
    ``[1, Hkv, Tk, D]``: the call transformers' sdpa makes for this step (grouped heads
    without copies of the keys)."""
    import torch

    gqa = query.shape[1] != key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)
