"""FA4 decode launches without FA4's per-call planning: whether plans are on, the plans kept,
and a plan's kernel looked up for a launch (:class:`Replay`).

FA4's ``_flash_attn_fwd`` spends about 70 µs of Python on an H200 host choosing a kernel
and its arguments; the launch itself takes about 9 µs
(``benchmarks/archive/2026-12-03/results/decode_profile_h200.md``). Eager decoding calls it once per layer
and step, on the host's critical path, with the same choice every time.

A *family* of calls is every fact FA4 plans from (each tensor's shape, strides, dtype,
device and grad flag, every scalar argument, the FA4 settings it reads at call time)
except one: the number of keys (the first dimension of ``k``/``v``, ``max_seqlen_k``),
which grows by one at every decode step. The first call of a family runs FA4 whole, its
compile cache observed: the key it looked up, the compiled function and the arguments it
called it with. If those arguments are the call's own tensors and constants, that is the
family's plan (:mod:`.plan`, :mod:`.observe`): later calls give the compiled function their
own tensors in the same places (:mod:`.launch`). Otherwise the family runs FA4 whole, always.

Sound only if FA4 chooses neither the kernel nor any argument by the key count for the
calls :mod:`.kv_cache` makes (dense queries, ``cu_seqlens_k``/``seqused_k``, an output
buffer, ``num_splits`` 1; no mask_mod, score_mod, block sparsity or page table). Read in
FA4's source, and checked by ``tests/decode/test_launch_plans.py`` against FA4's own planning
over random shapes at sm_90 and sm_100: plans are made only for the FA4 sources that check
ran on (the releases listing ``launch_plans`` in :mod:`fa4cache.fa4_releases`).
Any other FA4 is planned by FA4 at every call, as is any arch but those checked
(:data:`.launch.VERIFIED_ARCHS`). ``FA4CACHE_LAUNCH_PLANS=0`` turns plans off (read through
:func:`fa4cache.settings.decode_switches`); do that in a process
that patches FA4's planning functions at run time (the digest sees FA4's files, not its
functions in memory).

Where FA4 would act otherwise than a replay, FA4 runs whole: k and v of other lengths (FA4
refuses them) or none (it launches nothing), a family's first call with one key row (torch
then calls any row stride contiguous, so whether FA4 copies k is not yet known), a call FA4
makes tensors of its own for, or one whose tensors alias each other.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from fa4cache.settings import decode_switches

from .observe import unobserved
from .plan import Plan, settings

# Families kept (a process decodes with a few: one per layer kind and batch shape).
MAX_PLANS = 256

_generation = [0]  # how many times clear() ran (Replay.current)
_NOT_PLANNED = object()  # a family seen whose call is no plan (FA4 runs whole)
_plans: dict[tuple[Any, ...], Any] = {}
_verified: list[bool] = []  # [whether the installed FA4's sources are verified], once a process


def enabled() -> bool:
    """Whether launch plans are on: ``FA4CACHE_LAUNCH_PLANS`` (as :func:`decode_switches`
    holds it) and the installed FA4's sources verified for them (:mod:`fa4cache.fa4_releases`)."""
    if not decode_switches().launch_plans:
        return False
    if not _verified:
        from fa4cache import fa4_releases

        _verified.append(fa4_releases.on(fa4_releases.Coupling.LAUNCH_PLANS))
    return _verified[0]


def _no_fake_mode() -> bool:
    torch = sys.modules["torch"]  # imported: the call's tensors are its
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None


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
    return Replay(
        plan, fn, fi, fam[-2:], hasattr(cache, "memory_hits"), kernels, len(kernels), _generation[0]
    )


def _replay(fi: Any, fam: tuple[Any, ...], tensors: tuple[Any, ...]) -> bool:
    """Launch ``fam``'s planned kernel on ``tensors``; False where there is no plan to replay."""
    replay = _replay_of(fi, fam)
    if replay is None:
        return False
    replay.launch(tensors)
    return True


def clear() -> None:
    """Forget every plan (the next call of each family is planned by FA4 again)."""
    _generation[0] += 1
    _plans.clear()
