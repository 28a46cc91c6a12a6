"""An eager decode step of one sequence whose mask is all ones, on PyTorch's SDPA kernel.

At one row, an eager step is bound by host time, not by the attention kernel. FA4's launch
from Python (the step's key ranges, then a replayed launch in each layer) costs more host
time per layer than torch's C++ dispatch of its own flash kernel. Measured on the H200
inside ``generate`` (``benchmarks/results/probe_decode_ranges_h200.md``): 312 µs for the
first layer and 79 µs for each later one, against sdpa's 79 and 47.

So such a step runs as transformers' sdpa runs it: the same kernel and the same one host
sync per step, in the mask hook, to learn that the mask holds no padding (:func:`check`).
Every other step stays on FA4: larger batches, padding, sliding windows, softcapping,
static caches, and steps that torch.compile traces or a CUDA graph captures.
``FA4CACHE_ONE_ROW_SDPA=0`` keeps these steps on FA4 too.
"""

from __future__ import annotations

import weakref
from typing import Any

# Where FA4 runs (the CPU tests add "cpu": FA4 is a stand-in there, and SDPA is real).
DEVICE_TYPES = ("cuda",)

# Masks that check() read as all ones: id -> (a weak reference to the mask, its version then).
# A mask is a fresh view per forward (the hook slices it), which every layer of that forward gets.
_all_ones: dict[int, tuple[Any, int]] = {}


def applies(mask: Any) -> bool:
    """Whether a mask's step may run here: a real tensor (a fake one is a trace) on FA4's
    device, in eager code, outside CUDA-graph capture, not an inference tensor (it has no
    version to check), with the setting on."""
    import torch

    from fa4cache.settings import setting

    if type(mask) is not torch.Tensor or mask.device.type not in DEVICE_TYPES or mask.is_inference():
        return False
    if torch.compiler.is_compiling() or (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    return bool(setting("FA4CACHE_ONE_ROW_SDPA"))


def check(mask: Any) -> bool:
    """Read (one host sync) whether a one-row step's 2-D ``mask`` is all ones, and keep the
    answer for :func:`all_ones` while the mask lives unchanged. False where it does not apply."""
    if mask.shape[0] != 1 or not applies(mask):
        return False
    if not bool(mask.all()):
        return False
    if len(_all_ones) >= 64:  # masks of finished steps whose ids were not reused
        _all_ones.clear()
    _all_ones[id(mask)] = (weakref.ref(mask), mask._version)
    return True


def all_ones(mask: Any) -> bool:
    """Whether :func:`check` found ``mask`` all ones and it has not changed since (in eager
    code only: the lookup is by the object's id)."""
    hit = _all_ones.get(id(mask))
    return hit is not None and hit[0]() is mask and hit[1] == mask._version


def forward(query: Any, key: Any, value: Any, scale: float) -> Any:
    """``[1, 1, Hq, Dv]`` for ``query [1, Hq, 1, D]`` over every key of ``key``/``value``
    ``[1, Hkv, Tk, D]``: the call transformers' sdpa makes for this step (grouped heads
    without copies of the keys)."""
    import torch

    gqa = query.shape[1] != key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)
