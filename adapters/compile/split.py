"""A cold job's kernel set compiled across its nodes: each compiles about ceil(K / nodes).

When the kernel set is known (a model's, ``fa4cache warm``'s specs), every rank (or every
Ray node) runs ``fa4cache.warm(..., split=True)``, which calls :func:`compile_across`.
It works over whichever remote tier the store has (the c10d tier of a torchrun job, the
cluster tier of a Ray job): a claim is :meth:`~fa4cache.store.locks.StoreLocks.try_claim`. Nothing is agreed in
advance and no collective is issued: the ranks *claim* kernels. Each walks the set from its
own offset (``rank * K / world``), and claims a kernel by taking the node's file lock and the
job-wide lease without waiting (:meth:`DistributedTier.acquire` with ``wait=0``); a kernel
someone else holds, or that is published already, is left for later. Claimed kernels are
compiled and published to the job's store as usual. Then each rank takes the kernels it
left through the ordinary miss path: the local store, then the job's copy (waiting on the
lease of the rank compiling it), or a compile if that rank died. With N nodes that compile
at the same speed, a node compiles about ceil(K / N) of the K kernels and fetches the rest;
a node that starts late, or is slow, claims less (work stealing, not a fixed partition).

Without a process group (or a remote tier), every kernel is compiled here.
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
    compiled: dict[str, float] = field(default_factory=dict)  # digest -> its compile seconds, here


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
    store's :meth:`~fa4cache.store.locks.StoreLocks.try_claim`). Never waits."""
    try:
        return store.locks.try_claim(digest)
    except OSError:
        return None


def compile_across(
    store: Any,
    kernels: Sequence[T],
    digest: Callable[[T], str],
    present: Callable[[T], bool],
    compile_one: Callable[[T, Any], str],
    rank_world: tuple[int, int] | None = None,
) -> SplitResult:
    """Compile this rank's share of ``kernels`` and take the rest from the job (see the
    module docstring). ``compile_one(kernel, held)`` compiles one through the miss path,
    ``held`` its lock or None, and returns ``"compiled"`` or ``"present"``. ``rank_world``:
    this node's place among the job's (default: the torch.distributed job's, else ``RANK``
    and ``WORLD_SIZE``)."""
    rank, world = rank_world if rank_world is not None else _rank_world()
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
            res.compiled[digest(k)] = time.perf_counter() - c0
            store.counters.add("split_compiles")
    res.later = len(later)
    for k in later:
        c0 = time.perf_counter()
        if compile_one(k, None) == "compiled":
            res.compiled_later += 1
            res.compiled[digest(k)] = time.perf_counter() - c0
    res.compile_seconds = sum(res.compiled.values())
    res.seconds = time.perf_counter() - t0
    store.counters.flush()
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
