"""FA4 decode launches without FA4's per-call planning.

FA4's ``_flash_attn_fwd`` spends about 70 µs of Python on an H200 host choosing a kernel
and its arguments; the launch itself takes about 9 µs
(``benchmarks/results/decode_profile_h200.md``). Eager decoding calls it once per layer
and step, on the host's critical path, with the same choice every time.

A *family* of calls is every fact FA4 plans from (each tensor's shape, strides, dtype,
device and grad flag, every scalar argument, the FA4 settings it reads at call time)
except one: the number of keys (the first dimension of ``k``/``v``, ``max_seqlen_k``),
which grows by one at every decode step. The first call of a family runs FA4 whole, its
compile cache observed: the key it looked up, the compiled function and the arguments it
called it with. If those arguments are the call's own tensors and constants, that is the
family's plan: later calls give the compiled function their own tensors in the same
places. Otherwise the family runs FA4 whole, always.

Sound only if FA4 chooses neither the kernel nor any argument by the key count for the
calls :mod:`.kv_cache` makes (dense queries, ``cu_seqlens_k``/``seqused_k``, an output
buffer, ``num_splits`` 1; no mask_mod, score_mod, block sparsity or page table). Read in
FA4's source, and checked by ``tests/unit/test_launch_plans.py`` against FA4's own planning
over random shapes at sm_90 and sm_100: plans are made only for the FA4 sources that check
ran on (the releases listing ``launch_plans`` in :mod:`fa4cache.fa4_releases`).
Any other FA4 is planned by FA4 at every call, as is any arch but those checked
(:data:`VERIFIED_ARCHS`). ``FA4CACHE_LAUNCH_PLANS=0`` turns plans off; do that in a process
that patches FA4's planning functions at run time (the digest sees FA4's files, not its
functions in memory).

Where FA4 would act otherwise than a replay, FA4 runs whole: k and v of other lengths (FA4
refuses them) or none (it launches nothing), a family's first call with one key row (torch
then calls any row stride contiguous, so whether FA4 copies k is not yet known), a call FA4
makes tensors of its own for, or one whose tensors alias each other.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fa4cache.settings import setting

log = logging.getLogger(__name__)

# The archs whose planning tests/unit/test_launch_plans.py checks (sm_90, sm_100).
VERIFIED_ARCHS = frozenset({90, 100})
# The largest pointer alignment FA4 asks of a tensor (32 bytes: an output of head dim 512).
ALIGNMENT = 32
# Families kept (a process decodes with a few: one per layer kind and batch shape).
MAX_PLANS = 256

# The call's tensors, in the order a plan's slots index them, and its scalars (all of them
# in a family but max_seqlen_k, the key count).
TENSORS = ("q", "k", "v", "out", "cu_seqlens_k", "seqused_k")
SCALARS = ("max_seqlen_q", "softmax_scale", "causal", "softcap", "window_size_left", "window_size_right")


@dataclass(frozen=True)
class Plan:
    """One family's launch: ``fn`` (looked up in ``cache`` under ``key`` at each call, so
    that a cleared cache is noticed) called with ``slots`` (an index into :data:`TENSORS`
    per argument, None for the constant at that place in ``constants``)."""

    cache: Any
    key: Any
    slots: tuple[int | None, ...]
    constants: tuple[Any, ...]

    def arguments(self, tensors: tuple[Any, ...]) -> list[Any]:
        return [c if s is None else tensors[s] for s, c in zip(self.slots, self.constants)]


_WHERE = 6  # a family's aliasing and alignment (None: the usual call)
_generation = [0]  # how many times clear() ran (Replay.current)
_NOT_PLANNED = object()  # a family seen whose call is no plan (FA4 runs whole)
_plans: dict[tuple[Any, ...], Any] = {}
_capture_lock = threading.Lock()
_verified: list[bool] = []  # [whether the installed FA4's sources are verified], once a process


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


_SWITCH = "FA4CACHE_LAUNCH_PLANS"
_switch: list[Any] = [object(), None]  # _SWITCH as last read: [raw value, parsed]


def enabled() -> bool:
    raw = os.environ.get(_SWITCH)
    if raw != _switch[0]:  # parsed again only when changed (a decode layer reads it each call)
        # The value compared is the value parsed: the environment read again could have changed.
        _switch[:] = [raw, setting(_SWITCH, {} if raw is None else {_SWITCH: raw})]
    if not _switch[1]:
        return False
    if not _verified:
        from fa4cache import fa4_releases

        _verified.append(fa4_releases.on(fa4_releases.Coupling.LAUNCH_PLANS))
    return _verified[0]


def _no_fake_mode() -> bool:
    torch = sys.modules["torch"]  # imported: the call's tensors are its
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None


def _plain(tensors: tuple[Any, ...]) -> bool:
    """Real CUDA tensors that need no gradient (:func:`launch_replay` has checked that no fake
    mode, where FA4 launches nothing, is active)."""
    tensor = sys.modules["torch"].Tensor
    return all(type(t) is tensor and t.is_cuda and not t.requires_grad for t in tensors)


class _Observed:
    """FA4's compile cache as one thread's call sees it: the key it takes a kernel under and
    the arguments it calls the kernel with are recorded; every other thread, and every
    other use, goes straight through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.thread = threading.get_ident()
        self.calls: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = []

    def __contains__(self, key: Any) -> bool:
        return key in self.inner

    def __getitem__(self, key: Any) -> Any:
        fn = self.inner[key]
        if threading.get_ident() != self.thread:
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((key, fn, args, kwargs))
            return fn(*args, **kwargs)

        return call

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.inner[key] = fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def observe(
    entry: Any, run: Callable[[], Any]
) -> tuple[Any, list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]]]:
    """``run()`` with ``entry``'s (FA4's ``_flash_attn_fwd``) compile cache observed:
    (its result, the kernel calls it made: key, function, arguments)."""
    inner = entry.compile_cache
    seen = _Observed(inner)
    entry.compile_cache = seen
    try:
        result = run()
    finally:
        if entry.compile_cache is seen:  # not if an install() put its own cache there meanwhile
            entry.compile_cache = inner
    return result, seen.calls


def unobserved(cache: Any) -> Any:
    """``cache`` itself, if another thread's :func:`observe` has it wrapped for the moment."""
    return cache.inner if isinstance(cache, _Observed) else cache


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


def launch_replay(
    run_whole: Callable[..., Any], tensors: tuple[Any, ...], scalars: tuple[Any, ...], max_seqlen_k: int
) -> tuple[Any, Replay | None]:
    """FA4's forward for :mod:`.kv_cache`'s calls, writing ``out``: replayed from the call's
    family's plan, or ``run_whole(q, k, v, **kwargs)`` (FA4's ``_flash_attn_fwd``, or a
    stand-in). ``tensors`` in :data:`TENSORS`' order, ``scalars`` in :data:`SCALARS`';
    no dict of FA4's arguments is made unless FA4 runs whole (a decode layer's host time).
    Returns ``out``, and the :class:`Replay` launched where the call was replayed from a
    plan and its tensors are the usual six: no two alike, all on the alignment grid (None
    otherwise). A caller that derives its tensors the same way again may launch that replay
    itself while :meth:`Replay.current` holds."""
    fi = sys.modules.get("flash_attn.cute.interface")
    # The replay first: this runs in every layer of every decode step, where the host's time
    # is the step's time. No plain-tensor check before it: a plan is made only for plain
    # tensors, and its family holds each tensor's type, device and grad flag.
    fam = None
    if fi is not None and _no_fake_mode() and enabled():
        fam = _family_if_replayable(fi, tensors, scalars)
        replay = _replay_of(fi, fam) if fam is not None else None
        if replay is not None:
            replay.launch(tensors)
            return tensors[3], replay if fam[_WHERE] is None else None
    q, k, v, out, cu, used = tensors
    kwargs = {
        "cu_seqlens_k": cu, "seqused_k": used, "max_seqlen_k": max_seqlen_k, "out": out,
        **dict(zip(SCALARS, scalars)),
    }  # fmt: skip
    if fam is None or not _plain(tensors):
        return run_whole(q, k, v, **kwargs), None
    return _plan(fi, fam, run_whole, tensors, kwargs), None


def _family_if_replayable(fi: Any, tensors: tuple[Any, ...], scalars: tuple[Any, ...]) -> Any:
    """The call's family, or None where FA4 is to run whole without a plan being looked up:
    k and v of other lengths (FA4 refuses them) or none (it launches nothing)."""
    k, v = tensors[1], tensors[2]
    n = k.shape[0]
    if n != v.shape[0] or n == 0:
        return None
    return family(fi, tensors, scalars)


@dataclass(frozen=True)
class Replay:
    """A family's plan with its kernel as looked up in FA4's compile cache, and what the
    family holds of FA4's state (:func:`settings`)."""

    plan: Plan
    fn: Any
    fi: Any  # FA4's interface module
    settings: tuple[Any, ...]
    counts_hits: bool  # the cache counts memory hits (fa4cache's compile cache)
    kernels: dict[Any, Any]  # the compile cache's kernels, and how many it held (a cleared cache holds fewer)
    size: int
    generation: int  # _generation when looked up: clear() ends every replay made before it

    def launch(self, tensors: tuple[Any, ...]) -> None:
        if self.counts_hits:
            self.plan.cache.memory_hits += 1  # as FA4's own lookup counts it (fa4cache stats)
        self.fn(*self.plan.arguments(tensors))

    def current(self) -> bool:
        """Whether a call of this family may still be launched from it: no :func:`clear`
        since, plans on, no fake mode, FA4's state (:func:`settings`) and its compile cache
        object unchanged, and that cache holding as many kernels as it did (a cleared cache
        holds fewer; one refilled to the same count holds the kernel FA4 compiles for this
        key again)."""
        fi = self.fi
        cache = unobserved(fi._flash_attn_fwd.compile_cache)
        return (
            self.generation == _generation[0]
            and cache is self.plan.cache
            and getattr(cache, "cache", None) is self.kernels
            and len(self.kernels) == self.size
            and _no_fake_mode()
            and enabled()
            and settings(fi) == self.settings
        )


def settings(fi: Any) -> tuple[Any, ...]:
    """FA4's state in a family: :func:`fa4_settings` and which ``_flash_attn_fwd`` is installed."""
    return fa4_settings(fi), id(fi._flash_attn_fwd)


def _replay_of(fi: Any, fam: tuple[Any, ...]) -> Replay | None:
    """``fam``'s plan with its kernel, looked up now; None where there is no plan to replay."""
    plan = _plans.get(fam)
    if type(plan) is not Plan:
        return None
    cache = unobserved(fi._flash_attn_fwd.compile_cache)
    kernels = getattr(cache, "cache", None)
    # Looked up at each call: a cleared or replaced cache is noticed.
    fn = kernels.get(plan.key) if cache is plan.cache and isinstance(kernels, dict) else None
    if fn is None:
        _plans.pop(fam, None)  # the kernel left memory (a cleared cache, a new install): plan again
        return None
    return Replay(plan, fn, fi, fam[-2:], hasattr(cache, "memory_hits"), kernels, len(kernels), _generation[0])


def _replay(fi: Any, fam: tuple[Any, ...], tensors: tuple[Any, ...]) -> bool:
    """Launch ``fam``'s planned kernel on ``tensors``; False where there is no plan to replay."""
    replay = _replay_of(fi, fam)
    if replay is None:
        return False
    replay.launch(tensors)
    return True


def replay_or_plan(
    fi: Any, run_whole: Callable[..., Any], tensors: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """:func:`launch_replay` once it is known to apply (FA4's interface module ``fi``; the
    tensors taken as plain): the family's plan replayed, or FA4 run whole (observed, to make
    the plan)."""
    q, k, v, out = tensors[:4]
    fam = _family_if_replayable(fi, tensors, tuple(kwargs[n] for n in SCALARS))
    if fam is None:
        return run_whole(q, k, v, **kwargs)
    if _replay(fi, fam, tensors):
        return out
    return _plan(fi, fam, run_whole, tensors, kwargs)


def _plan(
    fi: Any, fam: tuple[Any, ...], run_whole: Callable[..., Any], tensors: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """FA4 run whole for a call of family ``fam`` that has no plan to replay: observed, to
    make the family's plan, where one may be made."""
    q, k, v = tensors[:3]
    if _plans.get(fam) is _NOT_PLANNED:
        return run_whole(q, k, v, **kwargs)
    if k.shape[0] < 2 or fi._get_device_arch() not in VERIFIED_ARCHS:
        # One key row: torch calls k contiguous whatever its row stride, so whether FA4 would
        # copy k is not yet known for the family (it is from two rows on). An arch whose
        # planning was not checked: FA4 plans.
        return run_whole(q, k, v, **kwargs)
    if not _capture_lock.acquire(blocking=False):
        return run_whole(q, k, v, **kwargs)  # another thread is planning: no waiting behind its compile
    try:
        entry = fi._flash_attn_fwd
        cache = entry.compile_cache
        result, calls = observe(entry, lambda: run_whole(q, k, v, **kwargs))
        made = plan_of(cache, calls, tensors)
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[fam] = made if made is not None else _NOT_PLANNED
        if made is None:
            log.debug(
                "fa4cache: an FA4 decode call is no plan (%d kernel calls); FA4 plans it every time",
                len(calls),
            )
    finally:
        _capture_lock.release()
    return result


def clear() -> None:
    """Forget every plan (the next call of each family is planned by FA4 again)."""
    _generation[0] += 1
    _plans.clear()
