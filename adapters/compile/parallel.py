"""The warm runner's ``jobs=N`` (``fa4cache warm -j N``): the kernels of every spec spread
over N worker processes (called by :mod:`fa4cache.adapters.compile.runner` only).

Workers are forked after FA4 is imported (from this process where it holds no GPU, else
from one GPU-blind compile server), so the import is paid once. Each worker lists the
kernels of all specs (FA4's own compile keys, :mod:`fa4cache.adapters.compile.kernel_set`)
and takes them one by one through the per-key lock, longest first, so ``-j`` speeds up
one spec as well as many; every kernel is compiled once, by whichever worker took it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fa4cache.adapters.compile import server as compile_server
from fa4cache.adapters.compile.kernel_set import SpecJob
from fa4cache.adapters.compile.task import CompileTask

from fa4cache.aot.spec import KernelSpec

log = logging.getLogger(__name__)


def warm_parallel(
    specs: list[KernelSpec],
    jobs: int,
    cache_dir: str,
    on_fork: Callable[[], None] = lambda: None,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One result per spec, as ``warm`` reports them (``compiles``, ``present``,
    ``seconds``: compile seconds of its kernels, summed, ``error``). ``on_fork``: called
    once the workers run (a progress thread may start then: never before a fork). ``env``:
    the target a GPU host's compile server compiles for (the runner's
    :meth:`~fa4cache.aot.plan.Target.env`); None: this process's.

    A kernel the workers found present is then loaded here, verified: one that fails its
    checksum is quarantined and compiled again (as ``warm -j 1`` does), and each present
    one gets its use recorded, so that ``prune --older-than`` keeps what warm confirmed."""
    task = CompileTask(jobs=tuple(SpecJob(s.to_dict()) for s in specs), wait=True)
    t0 = time.perf_counter()
    if compile_server.can_fork():
        # No GPU here: fork the workers from this process once it has imported FA4, so the
        # import is paid once (on a busy CPU that import is a large share of the work).
        from fa4cache.adapters.fa4.compile_cache import ahead_off as off
        from fa4cache.adapters.patch import install

        install(cache_dir)
        with off():
            import flash_attn.cute.interface  # noqa: F401
        results = _fork_run(task, jobs, on_fork)
        bad = confirm_present(cache_dir, results)
        if bad:  # quarantined: compile those again, in the same workers' way
            results += _fork_run(task.only(bad), min(jobs, len(bad)), lambda: None)
        return merge(specs, results, time.perf_counter() - t0, stored=_stored(cache_dir))
    env = {
        k: v for k, v in (env or {}).items() if k in compile_server.TARGET_VARS
    } or compile_server.target_env()
    if env is None:
        raise RuntimeError("warm: no target arch (give the runner a plan with its target)")
    env = {**env, "FA4CACHE_DIR": cache_dir}
    # A GPU here: one GPU-blind server imports FA4 once and forks the workers.
    server = compile_server.CompileServer(env)
    try:
        server.submit(task.forked(jobs))
        on_fork()
        results = [server.result() for _ in range(jobs)]
        bad = confirm_present(cache_dir, results)
        if bad:
            n = min(jobs, len(bad))
            server.submit(task.only(bad).forked(n))
            results += [server.result() for _ in range(n)]
    finally:
        server.close()
    return merge(specs, results, time.perf_counter() - t0, stored=_stored(cache_dir))


def _fork_run(task: CompileTask, jobs: int, on_fork: Callable[[], None]) -> list[dict[str, Any]]:
    from fa4cache.adapters.compile import worker as compile_worker

    children = [compile_worker.fork_child(task, progress=False) for _ in range(jobs)]
    on_fork()
    return [compile_worker.collect(pid, r) for pid, r in children]


def _unsaved(compiled: list[str], stored: set[str] | None) -> str | None:
    lost = [d for d in compiled if stored is not None and d not in stored]
    if not lost:
        return None
    return f"{len(lost)} kernel(s) compiled but not saved to the store (the workers' warnings say why)"


def confirm_present(cache_dir: str, results: list[dict[str, Any]]) -> set[str]:
    """Load every planned kernel no worker compiled, verified, and record its use; the
    digests of those that failed (quarantined by the load, confirmed under the key's lock).
    The workers only looked for the sidecar: an entry whose object was damaged would have
    been reported present and left as it was."""
    from fa4cache.store.store import Store

    planned = {d for r in results for job in r.get("jobs") or [] for d in job}
    compiled = {d for r in results for d in r.get("compiled", {})}
    present = planned - compiled
    if not present:
        return set()
    store = Store.at(cache_dir)
    refs = {e.ref.digest: e.ref for e in store.entries() if e.ref.digest in present}
    bad = set()
    for digest, ref in refs.items():
        art = store.load(ref, remote=False)
        if art is None:
            bad.add(digest)
            # The store's own warning already said so; this names warm's part.
            log.info(
                "fa4cache warm: stored %s kernel %s failed verification; compiling it again",
                ref.kind,
                digest[:16],
            )
        else:
            store.touch(art)
    store.flush_touches()
    store.counters.flush()
    return bad


def _stored(cache_dir: str) -> set[str]:
    from pathlib import Path

    from fa4cache.store.paths import Layout

    return {e.ref.digest for e in Layout(Path(cache_dir)).iter_entries()}


def merge(
    specs: list[KernelSpec], results: list[dict[str, Any]], wall: float, stored: set[str] | None = None
) -> list[dict[str, Any]]:
    """One result per spec. ``stored``: the digests in the store after the run; a kernel a
    worker compiled that is not among them was not saved (a publish error), and its spec
    is reported failed, not ok."""
    planned: list[list[str]] | None = next((r["jobs"] for r in results if r.get("jobs")), None)
    compiled: dict[str, float] = {}
    for r in results:
        for d, s in r.get("compiled", {}).items():
            compiled[d] = compiled.get(d, 0.0) + s
    errors: dict[int, str] = {}
    for r in results:
        for i, e in r.get("errors", {}).items():
            errors.setdefault(int(i), e)
    worker_error = next((r["error"] for r in results if r.get("error")), None)
    out = []
    counted: set[str] = set()
    for i, _ in enumerate(specs):
        digests = planned[i] if planned is not None else []
        mine = [d for d in digests if d in compiled and d not in counted]
        counted.update(digests)
        out.append(
            {
                "compiles": len(mine),
                "present": len(digests) - len(mine),
                # The kernels of every spec ran side by side: the wall is the whole run's.
                "seconds": wall,
                "compile_seconds": sum(compiled[d] for d in mine),
                "error": errors.get(i)
                or (worker_error if planned is None else None)
                or _unsaved([d for d in digests if d in compiled], stored),
            }
        )
    return out
