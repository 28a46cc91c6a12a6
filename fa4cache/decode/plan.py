"""A launch plan, and the family of FA4 decode calls it serves (:mod:`.launch_plans`).

A *family* of calls is every fact FA4 plans from (each tensor's shape, strides, dtype,
device and grad flag, every scalar argument, the FA4 settings it reads at call time)
except one: the number of keys (the first dimension of ``k``/``v``, ``max_seqlen_k``),
which grows by one at every decode step. A *plan* is what one observed FA4 call of the
family did (:mod:`.observe`): the kernel it took from its compile cache, and the
arguments it called it with, when those are the call's own tensors and constants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# The largest pointer alignment FA4 asks of a tensor (32 bytes: an output of head dim 512).
ALIGNMENT = 32

# A call's six tensors are q, k, v, out, cu_seqlens_k and seqused_k, in that order (a plan's
# slots index them); its scalars, all of them in a family but max_seqlen_k (the key count):
SCALARS = ("max_seqlen_q", "softmax_scale", "causal", "softcap", "window_size_left", "window_size_right")


@dataclass(frozen=True)
class Plan:
    """One family's launch: ``fn`` (looked up in ``cache`` under ``key`` at each call, so
    that a cleared cache is noticed) called with ``slots`` (an index into the call's six
    tensors per argument, None for the constant at that place in ``constants``)."""

    cache: Any
    key: Any
    slots: tuple[int | None, ...]
    constants: tuple[Any, ...]

    def arguments(self, tensors: tuple[Any, ...]) -> list[Any]:
        return [c if s is None else tensors[s] for s, c in zip(self.slots, self.constants)]


def fa4_settings(fi: Any) -> tuple[Any, ...]:
    """What FA4 reads besides its arguments when it plans a forward call: the device arch,
    its scheduler/2-CTA/ping-pong switches, the SM-count override and its log level. Read as
    the verified sources (:mod:`fa4cache.fa4_releases`) keep them, module globals behind
    FA4's getters: a function call less for each, in every decode layer. A getter replaced
    at run time (``utils._get_use_clc_scheduler_default`` and the like) is not seen: a
    process that patches FA4's functions sets ``FA4CACHE_LAUNCH_PLANS=0``."""
    u = fi.utils
    return (
        fi._get_device_arch(),  # kept by FA4 for the process (functools.lru_cache)
        u._fa_clc_enabled,
        u._fa_disable_2cta_enabled,
        u._fa_disable_2cta_cuda12,
        u._fa_disable_s_ping_pong_enabled,
        os.environ.get("FLASH_ATTENTION_NUM_SMS"),
        fi.fa_logging._fa_log_level,  # in FA4's compile key (device printf)
    )


def _pointers(tensors: tuple[Any, ...]) -> list[int]:
    """Each tensor's first element's address (a seam: the CPU tests' fake tensors have none)."""
    return [t.data_ptr() for t in tensors]


def family(fi: Any, tensors: tuple[Any, ...], scalars: tuple[Any, ...]) -> tuple[Any, ...]:
    """Every fact FA4 plans a call from but the key count: each tensor's type, shape, strides,
    dtype, device and grad flag (k's and v's shape without dimension 0, the key count: their
    strides do not depend on it, a dense ``[tokens, h, d]``), which tensors alias and their
    pointer alignment, the scalars, FA4's settings. Written out, not looped: host time in every
    decode layer."""
    q, k, v, out, cu, used = tensors
    ptrs = _pointers(tensors)
    p0, p1, p2, p3, p4, p5 = ptrs
    if len(set(ptrs)) == 6 and not (p0 | p1 | p2 | p3 | p4 | p5) % ALIGNMENT:
        where: Any = None  # the usual call, said briefly: no two alike, all on the grid
    else:
        # Which tensors share a first element (k is v in a test: a plan's slots must not mix
        # them up for a call where they differ), and each one's pointer alignment (FA4 copies
        # a tensor off its 16-byte grid, and its kernels assume the alignment they saw).
        where = (tuple(ptrs.index(p) for p in ptrs), tuple(p % ALIGNMENT for p in ptrs))
    return (
        (type(q), q.shape, q.stride(), q.dtype, q.device, q.requires_grad),
        (type(k), k.shape[1:], k.stride(), k.dtype, k.device, k.requires_grad),
        (type(v), v.shape[1:], v.stride(), v.dtype, v.device, v.requires_grad),
        (type(out), out.shape, out.stride(), out.dtype, out.device, out.requires_grad),
        (type(cu), cu.shape, cu.stride(), cu.dtype, cu.device, cu.requires_grad),
        (type(used), used.shape, used.stride(), used.dtype, used.device, used.requires_grad),
        where, scalars, *settings(fi),  # the last two: FA4's state (Replay.settings)
    )  # fmt: skip


def settings(fi: Any) -> tuple[Any, ...]:
    """FA4's state in a family: :func:`fa4_settings` and which ``_flash_attn_fwd`` is installed."""
    return fa4_settings(fi), id(fi._flash_attn_fwd)


def _holds_tensor(obj: Any, depth: int = 0) -> bool:
    import torch

    if isinstance(obj, torch.Tensor):
        return True
    if depth > 4:
        return True  # too deep to tell: not a plan
    if isinstance(obj, (tuple, list)):
        return any(_holds_tensor(x, depth + 1) for x in obj)
    if isinstance(obj, dict):
        return any(_holds_tensor(x, depth + 1) for x in obj.values())
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return False
    fields = getattr(obj, "__dict__", None)
    return fields is not None and any(_holds_tensor(x, depth + 1) for x in fields.values())


def _same_tensor(a: Any, t: Any) -> bool:
    import torch

    return (
        torch._C._is_alias_of(a, t)
        and a.shape == t.shape
        and a.stride() == t.stride()
        and a.storage_offset() == t.storage_offset()
        and a.dtype == t.dtype
    )


def plan_of(
    cache: Any, calls: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]], tensors: tuple[Any, ...]
) -> Plan | None:
    """The plan one observed FA4 call makes: one kernel call, positional, whose tensors are
    all the call's own (None otherwise: FA4 made a tensor of its own, or called more than
    one kernel)."""
    import torch

    if len(calls) != 1:
        return None
    key, _fn, args, kwargs = calls[0]
    if kwargs:
        return None
    slots: list[int | None] = []
    constants: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            matches = [i for i, t in enumerate(tensors) if _same_tensor(a, t)]
            if len(matches) != 1:  # FA4's own tensor, or one of two identical views: not a plan
                return None
            slots.append(matches[0])
            constants.append(None)
        elif _holds_tensor(a):
            return None
        else:
            slots.append(None)
            constants.append(a)
    return Plan(cache, key, tuple(slots), tuple(constants))
