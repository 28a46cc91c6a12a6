"""A cold job's kernel set compiled across its nodes: each compiles about ceil(K / nodes).

When the kernel set is known (a model's, ``fa4cache warm``'s specs), every rank calls
:func:`compile_across` (or :func:`warm_across` for kernel-set jobs). Nothing is agreed in
advance and no collective is issued: the ranks *claim* kernels. Each walks the set from its
own offset (``rank * K / world``), and claims a kernel by taking the node's file lock and the
job-wide lease without waiting (:meth:`DistributedTier.acquire` with ``wait=0``); a kernel
someone else holds, or that is published already, is left for later. Claimed kernels are
compiled and published to the job's store as usual. Then each rank takes the kernels it
left through the ordinary miss path: the local store, then the job's copy (waiting on the
lease of the rank compiling it), or a compile if that rank died. With N nodes that compile
at the same speed, a node compiles about ceil(K / N) of the K kernels and fetches the rest;
a node that starts late, or is slow, claims less (work stealing, not a fixed partition).

Without a process group (or a distributed tier), every kernel is compiled here, as before.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class SplitResult:
    kernels: int = 0
    claimed: int = 0  # compiled here as this rank's share
    later: int = 0  # left to others at first: fetched (or compiled if their holder died)
    compiled_later: int = 0
    seconds: float = 0.0
    compile_seconds: float = 0.0  # seconds spent compiling claimed and later kernels
    digests: list[str] = field(default_factory=list)


def _rank_world() -> tuple[int, int]:
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return int(os.environ.get("RANK") or 0), int(os.environ.get("WORLD_SIZE") or 1)


def order(items: Sequence[T], rank: int, world: int) -> list[T]:
    """``items`` rotated to start at this rank's offset: ranks start on different kernels."""
    if not items:
        return []
    start = (rank * len(items)) // max(world, 1)
    return list(items[start:]) + list(items[:start])


def claim(store: Any, digest: str) -> Any | None:
    """The node lock and job lease of ``digest`` if both are free now, else None (the
    store's :meth:`~fa4cache.store.store.Store.try_claim`). Never waits."""
    try:
        return store.try_claim(digest)
    except OSError:
        return None


def compile_across(
    store: Any,
    kernels: Sequence[T],
    digest: Callable[[T], str],
    present: Callable[[T], bool],
    compile_one: Callable[[T, Any], str],
) -> SplitResult:
    """Compile this rank's share of ``kernels`` and take the rest from the job (see the
    module docstring). ``compile_one(kernel, held)`` compiles one through the miss path,
    ``held`` its lock or None, and returns ``"compiled"`` or ``"present"``."""
    rank, world = _rank_world()
    res = SplitResult(kernels=len(kernels), digests=[digest(k) for k in kernels])
    t0 = time.perf_counter()
    later: list[T] = []
    for k in order(kernels, rank, world):
        if present(k):
            continue
        held = claim(store, digest(k))
        if held is None:
            later.append(k)
            continue
        c0 = time.perf_counter()
        if compile_one(k, held) == "compiled":
            res.claimed += 1
            res.compile_seconds += time.perf_counter() - c0
            store.count("split_compiles")
    res.later = len(later)
    for k in later:
        c0 = time.perf_counter()
        if compile_one(k, None) == "compiled":
            res.compiled_later += 1
            res.compile_seconds += time.perf_counter() - c0
    res.seconds = time.perf_counter() - t0
    store.flush_counters()
    log.info(
        "fa4cache: kernel set of %d: compiled %d as this rank's share, %d more after others left them, "
        "%d from the job (%.1f s)",
        res.kernels,
        res.claimed,
        res.compiled_later,
        res.later - res.compiled_later,
        res.seconds,
    )
    return res


def warm_across(jobs: Sequence[Any]) -> SplitResult:
    """:func:`compile_across` for kernel-set jobs (:class:`~fa4cache.adapters.compile.kernel_set.SpecJob`,
    ``CallJob``) in a process that called ``fa4cache.install()``."""
    from fa4cache.adapters.compile import kernel_set

    from fa4cache.store import runtime
    from fa4cache.store.paths import EntryRef

    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    if store is None or tc is None:
        raise RuntimeError("warm_across needs fa4cache.install() first")
    kernels: list[tuple[Any, Any]] = []
    seen: set[str] = set()
    for job in jobs:
        for k in kernel_set.plan(job.run):
            if k.digest not in seen:
                seen.add(k.digest)
                kernels.append((job, k))
    return compile_across(
        store,
        kernels,
        digest=lambda jk: jk[1].digest,
        present=lambda jk: store.has(EntryRef(tc.id, jk[1].kind, jk[1].digest)),
        compile_one=lambda jk, held: kernel_set.compile_one(jk[0].run, jk[1], held),
    )
