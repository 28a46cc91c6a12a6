"""A decode call's FA4 launch (:mod:`.kv_cache`'s calls): replayed from its family's launch
plan (:mod:`.launch_plans`), or FA4 run whole, observed where that makes the family's plan;
and FA4's forward itself, the seam the CPU tests put their FA4 stand-in in."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from fa4cache.errors import quiet_library_warnings

from . import launch_plans
from .launch_plans import Replay, _no_fake_mode, _replay, _replay_of, enabled
from .observe import observe
from .plan import SCALARS, family, plan_of

log = logging.getLogger(__name__)

# The archs whose planning tests/decode/test_launch_plans.py checks (sm_90, sm_100).
VERIFIED_ARCHS = frozenset({90, 100})
_WHERE = 6  # a family's aliasing and alignment (None: the usual call)
_capture_lock = threading.Lock()


def _fa4_forward(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    """FA4's forward (a seam: the CPU tests put the FA4 stand-in here)."""
    from flash_attn.cute import interface as fi

    return fi._flash_attn_fwd(q, k, v, **kwargs)[0]


def _quiet_fa4_forward(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    """:func:`_fa4_forward`, CUTLASS's notes on a compile silenced (not the user's to act on)."""
    with quiet_library_warnings():
        return _fa4_forward(q, k, v, **kwargs)


def launch(
    q: Any, k: Any, v: Any, out: Any, cu: Any, used: Any, scalars: tuple[Any, ...], keys: int
) -> tuple[Any, Any]:
    """A KV-cache call's FA4 launch: replayed from its plan after the first call of its kind
    (FA4's own planning is most of a decode call's host time), else :func:`_fa4_forward`.
    ``scalars`` in :data:`.plan.SCALARS`' order; ``keys``: FA4's ``max_seqlen_k``. Writes
    ``out``; returns it and the replay launched (or None: :func:`launch_replay`)."""
    return launch_replay(_quiet_fa4_forward, (q, k, v, out, cu, used), scalars, keys)


def _plain(tensors: tuple[Any, ...]) -> bool:
    """Real CUDA tensors that need no gradient (:func:`launch_replay` has checked that no fake
    mode, where FA4 launches nothing, is active)."""
    tensor = sys.modules["torch"].Tensor
    return all(type(t) is tensor and t.is_cuda and not t.requires_grad for t in tensors)


def launch_replay(
    run_whole: Callable[..., Any], tensors: tuple[Any, ...], scalars: tuple[Any, ...], max_seqlen_k: int
) -> tuple[Any, Replay | None]:
    """FA4's forward for the KV-cache calls, writing ``out``: replayed from the call's
    family's plan, or ``run_whole(q, k, v, **kwargs)`` (FA4's ``_flash_attn_fwd``, or a
    stand-in). ``tensors``: q, k, v, out, ``cu_seqlens_k``, ``seqused_k``, ``scalars`` in :data:`SCALARS`';
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
    fi: Any,
    fam: tuple[Any, ...],
    run_whole: Callable[..., Any],
    tensors: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """FA4 run whole for a call of family ``fam`` that has no plan to replay: observed, to
    make the family's plan, where one may be made."""
    q, k, v = tensors[:3]
    if launch_plans._plans.get(fam) is launch_plans._NOT_PLANNED:
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
        kept = launch_plans._plans
        if len(kept) >= launch_plans.MAX_PLANS:
            kept.clear()
        kept[fam] = made if made is not None else launch_plans._NOT_PLANNED
        if made is None:
            log.debug(
                "fa4cache: an FA4 decode call is no plan (%d kernel calls); FA4 plans it every time",
                len(calls),
            )
    finally:
        _capture_lock.release()
    return result
