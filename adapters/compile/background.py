"""The warm runner's ``background=True`` (called by :mod:`fa4cache.adapters.compile.runner`
only): a plan's kernel specs compiled by this process's compile server's children while this
process goes on. At model load this is the model's whole kernel set
(:mod:`fa4cache.adapters.transformers.model_load`).

* A set the store holds already starts no server: a server is a process with torch and FA4
  imported, beside each rank. The store's sidecars say so, without FA4.
* The children list the specs' kernels and take those nobody holds or has, each through its
  per-key lock, so nothing compiles twice, whoever else asks for it.
* This process's compile server (:mod:`fa4cache.adapters.compile.ahead` owns it) does the
  work when it compiles for the plan's target and store; otherwise a server of the run's own.
* The work is ahead of any need, so an exit kills the server rather than waiting for it.
  Whatever was stored by then is kept.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from fa4cache.adapters.compile import server as compile_server
from fa4cache.adapters.compile.report import WarmReport, WarmRow, row_of
from fa4cache.adapters.compile.task import KERNELS_PER_SPEC, CompileTask

from fa4cache.aot.plan import WarmPlan
from fa4cache.aot.spec import KernelSpec

log = logging.getLogger(__name__)


class Warming:
    """A warm run in the background. Its :meth:`report` fills in as the server's children
    finish. A run that started nothing (``workers == 0``) says why in ``skipped``."""

    def __init__(
        self,
        plan: WarmPlan,
        cache_dir: str | None,
        *,
        workers: int = 0,
        skipped: str | None = None,
        rows: tuple[WarmRow, ...] = (),
    ) -> None:
        self.plan = plan
        self.cache_dir = cache_dir
        self.workers = workers  # children forked for the run
        self.skipped = skipped  # why nothing started: "stored", "no compile server"
        self.servers: tuple[compile_server.CompileServer, ...] = ()
        self._rows = rows  # a run that started nothing: its rows, known at once
        self._results: list[dict[str, Any]] = []
        self._ended: str | None = None  # the server exited before every child reported
        self._changed = threading.Condition()
        self._t0 = time.perf_counter()
        self._seconds = 0.0

    @property
    def started(self) -> bool:
        return self.workers > 0

    @property
    def done(self) -> bool:
        with self._changed:
            return self._finished()

    def _finished(self) -> bool:
        return self._ended is not None or len(self._results) >= self.workers

    def _take(self, result: dict[str, Any]) -> None:
        """One child's result (from the server's reader thread)."""
        with self._changed:
            if result.get("ended"):
                if not self._finished():
                    self._ended = str(result.get("error") or "the compile server exited")
            else:
                self._results.append(result)
            self._seconds = time.perf_counter() - self._t0
            self._changed.notify_all()

    def wait(self, timeout: float | None = None) -> WarmReport:
        """The report once every child has reported (or after ``timeout`` seconds)."""
        with self._changed:
            self._changed.wait_for(self._finished, timeout)
        return self.report()

    def report(self) -> WarmReport:
        """The run's report so far: no rows until the first child reports."""
        from fa4cache.adapters.compile.parallel import merge

        with self._changed:
            results, seconds, ended = list(self._results), self._seconds, self._ended
        rows = self._rows
        if results:
            specs = self.plan.specs
            rows = tuple(row_of(s, r) for s, r in zip(specs, merge(specs, results, seconds)))
        return WarmReport(self.plan.target, rows, seconds, self.cache_dir, error=ended)


def start(store: Any, plan: WarmPlan, jobs: int | None) -> Warming:
    """Start ``plan`` (kernel specs only) in the background; ``jobs``: children to fork
    (None: this process's share of the cores, :func:`.ahead.children`)."""
    from fa4cache.adapters.compile import ahead
    from fa4cache.adapters.compile.task import default_jobs

    root = str(store.root) if getattr(store, "root", None) is not None else None
    specs = plan.specs
    if not specs:
        return Warming(plan, root, skipped="nothing to compile")
    stored = stored_kernels(store, specs)
    if _complete(specs, stored):
        rows = tuple(WarmRow(s, 0, n, 0.0, kernels=n) for s, n in zip(specs, stored))
        return Warming(plan, root, skipped="stored", rows=rows)
    env = ahead.store_env(store, plan.target.env())
    server = ahead._get_server(env=env) if store.writable else None
    if server is not None and not server.compiles_for(env):
        # This process's server compiles for another target: the run gets one of its own.
        server = compile_server.CompileServer(env, on_started=ahead.note_started, keep_results=False)
    if server is None:
        return Warming(plan, root, skipped="no compile server (no writable store)")
    n = jobs if jobs is not None else ahead.children(default_jobs(specs))
    run = Warming(plan, root, workers=n)
    run.servers = (server,)
    task = CompileTask(
        jobs=tuple(_spec_job(s) for s in specs), ahead=True, fork=n, tag=f"background-{uuid.uuid4().hex}"
    )
    if not server.submit(task, on_result=run._take):
        run._take({"ended": True, "error": "the compile server exited"})
    # Ahead of any need: an exit does not wait for it (what was stored by then is kept).
    server.finish_at_exit = False
    return run


def _spec_job(spec: KernelSpec) -> Any:
    from fa4cache.adapters.compile.kernel_set import SpecJob

    return SpecJob(spec.to_dict())


def stored_kernels(store: Any, specs: list[KernelSpec]) -> list[int]:
    """How many entries of the store record each of ``specs`` in their sidecars (as warm
    stored them). Judged without FA4, which would have to trace the set to name its keys; a
    set warmed under an older toolchain counts too, and its first step then compiles what it
    lacks, as any miss does."""
    want = [json.dumps(s.to_dict(), sort_keys=True) for s in specs]
    have = dict.fromkeys(want, 0)
    if specs:
        for e in store.entries():
            side = store.read_sidecar(e.ref)
            spec = side.spec if side is not None else None
            if isinstance(spec, dict):
                key = json.dumps(spec, sort_keys=True)
                if key in have:
                    have[key] += 1
    return [have[k] for k in want]


def set_is_stored(specs: list[KernelSpec]) -> bool:
    """Whether the installed store holds every kernel of ``specs``, as many entries per spec
    as the spec has kernels (:func:`stored_kernels`)."""
    from fa4cache.store import runtime

    store = runtime.installed_store()
    if store is None or not specs:
        return False
    return _complete(specs, stored_kernels(store, specs))


def _complete(specs: list[KernelSpec], stored: list[int]) -> bool:
    return bool(specs) and all(n >= KERNELS_PER_SPEC[s.backward] for s, n in zip(specs, stored))
