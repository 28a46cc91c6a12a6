"""The one warm runner: compile a :class:`~fa4cache.aot.plan.WarmPlan` into the store and
report one row per item (``fa4cache.warm``; the CLI's ``warm`` and Ray's ``prewarm`` call it).

Where the kernels are compiled is an option, not another entry point:

* ``jobs=1``: in this process, item by item;
* ``jobs=N`` (None: one per core and kernel): the kernels of every spec over N workers
  forked after FA4 is imported (:mod:`fa4cache.adapters.compile.parallel`);
* ``split=True`` (or a ``(rank, world)`` pair): across a job's nodes, each claiming its share
  of the specs' kernels through the store's remote tier (the c10d tier of a torchrun job,
  the cluster tier of a Ray job) and taking the rest from the job
  (:mod:`fa4cache.adapters.compile.split`);
* ``background=True``: by this process's compile server's children while this process goes
  on; the call returns at once with a handle whose report fills in
  (:mod:`fa4cache.adapters.compile.background`; at model load, the model's kernel set).

Jit calls (QuACK, ``@jit_cache``) and generation calls run in this process in every mode
(through the store's miss path, so a job's leases still compile each once).

The target travels in the plan: the variables FA4, the CuTe DSL and QuACK read for a
cross-compile are set here, for the run only, and put back after it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from fa4cache.adapters.compile.report import WarmReport, WarmRow, row_of
from fa4cache.adapters.compile.target import target_scope

from fa4cache.aot.jit_spec import JitCall
from fa4cache.aot.plan import GenerationCall, Item, Target, WarmPlan
from fa4cache.aot.spec import KernelSpec
from fa4cache.errors import quiet_library_warnings

if TYPE_CHECKING:
    from fa4cache.adapters.compile.background import Warming

log = logging.getLogger(__name__)


@overload
def warm(
    items: WarmPlan | Iterable[Item | dict[str, Any]],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    jobs: int | None = 1,
    split: bool | tuple[int, int] = False,
    background: Literal[False] = False,
    num_sms: int | None = None,
    on_start: Callable[[], None] | None = None,
    on_row: Callable[[WarmRow], None] | None = None,
) -> WarmReport: ...


@overload
def warm(
    items: WarmPlan | Iterable[Item | dict[str, Any]],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    jobs: int | None = 1,
    split: bool | tuple[int, int] = False,
    background: Literal[True],
    num_sms: int | None = None,
    on_start: Callable[[], None] | None = None,
    on_row: Callable[[WarmRow], None] | None = None,
) -> Warming: ...


def warm(
    items: WarmPlan | Iterable[Item | dict[str, Any]],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    jobs: int | None = 1,
    split: bool | tuple[int, int] = False,
    background: bool = False,
    num_sms: int | None = None,
    on_start: Callable[[], None] | None = None,
    on_row: Callable[[WarmRow], None] | None = None,
) -> WarmReport | Warming:
    """Compile ``items`` (a :class:`~fa4cache.aot.plan.WarmPlan`, or KernelSpec / JitCall /
    GenerationCall items or their dicts, for the arch they name) into the store; one row per
    item. Needs no GPU.

    ``cache_dir``: the store (default: the installed one, else ``FA4CACHE_DIR``'s).
    ``jobs``: workers for the specs' kernels (None: one per core and kernel). ``split``: claim
    this node's share of the specs' kernels and take the rest from the job (every rank, or
    every node, calls it; needs a remote tier: ``install(distributed=True)`` or a Ray job's
    ``fa4cache.env(..., cluster=True)``); a ``(rank, world)`` pair names this node's place.
    ``background``: kernel specs only; returns at once a
    :class:`~fa4cache.adapters.compile.background.Warming` whose ``report()`` fills in as
    the compile server's children finish (``wait()`` for the whole report), with ``jobs``
    children (None: this process's share of the cores); a set the store holds starts none.
    ``num_sms``: the target's SM count when ``items`` is not a plan. ``on_start``: called once
    any workers run (a progress thread may start then, never before a fork); ``on_row``:
    called as each item's row is ready."""
    plan = items if isinstance(items, WarmPlan) else WarmPlan.of(items, num_sms=num_sms)
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        from fa4cache.errors import ConfigError

        raise ConfigError(f"jobs: expected a positive number of workers or None, got {jobs!r}")
    if background:
        return _background(plan, cache_dir, jobs, split)
    t0 = time.perf_counter()
    rows: dict[int, WarmRow] = {}
    started = [False]

    def start() -> None:
        if not started[0]:
            started[0] = True
            if on_start is not None:
                on_start()

    def done(i: int, row: WarmRow) -> None:
        rows[i] = row
        if on_row is not None:
            on_row(row)

    claimed = left = 0
    with target_scope(plan.target):
        store = _store(cache_dir)
        jit = [(i, c) for i, c in enumerate(plan.items) if isinstance(c, JitCall)]
        spec_at = [i for i, s in enumerate(plan.items) if isinstance(s, KernelSpec)]
        specs: list[KernelSpec] = [plan.items[i] for i in spec_at]  # type: ignore[misc]
        for i, c in jit:
            start()
            done(i, _jit_row(store, c))
        if specs and split:
            start()
            where = split if isinstance(split, tuple) else None
            spec_rows, claimed, left = _split_rows(store, specs, where)
        elif specs:
            n = jobs if jobs is not None else _default_jobs(specs)
            spec_rows = _spec_rows(store, plan.target, specs, n, start)
        for i, r in zip(spec_at, spec_rows if specs else []):
            done(i, r)
        for i, g in enumerate(plan.items):
            if isinstance(g, GenerationCall):
                start()
                done(i, _generation_row(store, g))
        store.counters.flush()
    return WarmReport(
        target=plan.target,
        rows=tuple(rows[i] for i in sorted(rows)),
        seconds=time.perf_counter() - t0,
        cache_dir=str(store.root) if getattr(store, "root", None) is not None else None,
        claimed=claimed,
        left=left,
    )


def _background(plan: WarmPlan, cache_dir: Any, jobs: int | None, split: Any) -> Warming:
    from fa4cache.adapters.compile import background

    from fa4cache.errors import ConfigError

    if split:
        raise ConfigError("warm: background=True runs on this node; split=True is a mode of its own")
    other = [i.label() for i in plan.items if not isinstance(i, KernelSpec)]
    if other:
        raise ConfigError(f"warm: background=True compiles kernel specs only, not {', '.join(other)}")
    return background.start(_store(cache_dir), plan, jobs)


def _store(cache_dir: Any) -> Any:
    """The installed store when it is the one asked for (an install with a remote tier stays
    as it is), else ``cache_dir``'s, installed."""
    from fa4cache.adapters.patch import install

    from fa4cache.store import runtime

    current = runtime.installed_store()
    if current is not None and (
        cache_dir is None or Path(cache_dir).expanduser().resolve() == Path(current.root).resolve()
    ):
        return current
    return install(None if cache_dir is None else str(cache_dir))


def _default_jobs(specs: list[KernelSpec]) -> int:
    from fa4cache.adapters.compile.task import default_jobs

    return default_jobs(specs)


def _spec_rows(
    store: Any, target: Target, specs: list[KernelSpec], jobs: int, start: Callable[[], None]
) -> list[WarmRow]:
    if jobs > 1:
        # Every kernel of every spec is one unit of work: -j spreads the kernels of one spec too.
        from fa4cache.adapters.compile.parallel import warm_parallel

        results = warm_parallel(specs, jobs, str(store.root), on_fork=start, env=target.env())
        return [row_of(s, r) for s, r in zip(specs, results)]
    from fa4cache.adapters.compile.warm_specs import compile_spec, counted
    from fa4cache.adapters.fa4.compile_cache import ahead_off
    from fa4cache.adapters.patch import fold_all_hits

    start()
    out = []
    for spec in specs:

        def run(spec: KernelSpec = spec) -> None:
            with ahead_off():  # warm compiles the whole set itself
                compile_spec(spec)

        out.append(row_of(spec, counted(store, fold_all_hits, spec.label(), run)))
    return out


def _split_rows(
    store: Any, specs: list[KernelSpec], where: tuple[int, int] | None
) -> tuple[list[WarmRow], int, int]:
    """The specs' kernels claimed across the job's nodes (:func:`split.compile_across`); a
    kernel counts as compiled for the first spec that asked for it."""
    from fa4cache.adapters.compile import kernel_set, split
    from fa4cache.adapters.fa4.compile_cache import ahead_off
    from fa4cache.adapters.patch import fold_all_hits

    from fa4cache.store import runtime
    from fa4cache.store.paths import EntryRef

    jobs = [kernel_set.SpecJob(s.to_dict()) for s in specs]
    errors: dict[int, str] = {}
    planned: list[list[str]] = []
    kernels: list[tuple[int, Any]] = []
    seen: set[str] = set()
    in_memory: list[int] = []  # kernels this process holds already: planning never lists them

    def memory_hits() -> float:
        fold_all_hits()
        return float(store.counters.counts().get("memory_hits", 0))

    with ahead_off():  # the plan is the set: no compile-ahead of kernels nobody asked for
        for i, job in enumerate(jobs):
            m0 = memory_hits()
            try:
                ks = kernel_set.plan(job.run)
            except Exception as e:
                errors[i] = f"{type(e).__name__}: {e}"
                ks = []
            in_memory.append(int(memory_hits() - m0))
            planned.append([k.digest for k in ks])
            for k in ks:
                if k.digest not in seen:
                    seen.add(k.digest)
                    kernels.append((i, k))

        tc = runtime.current_toolchain()  # after planning: FA4 is imported, its patches named
        if tc is None:
            raise RuntimeError("warm(split=True): no toolchain installed")

        def compile_one(ik: tuple[int, Any], held: Any) -> str:
            i, k = ik
            try:
                return kernel_set.compile_one(jobs[i].run, k, held)
            except Exception as e:  # one bad kernel must not stop the others
                errors.setdefault(i, f"{type(e).__name__}: {e}")
                log.warning("fa4cache warm: %s failed: %s", specs[i].label(), errors[i])
                return "failed"

        res = split.compile_across(
            store,
            kernels,
            digest=lambda ik: ik[1].digest,
            present=lambda ik: store.has(EntryRef(tc.id, ik[1].kind, ik[1].digest)),
            compile_one=compile_one,
            rank_world=where,
        )
    rows, counted_here = [], set()
    for i, spec in enumerate(specs):
        mine = [d for d in planned[i] if d in res.compiled and d not in counted_here]
        counted_here.update(planned[i])
        compile_s = sum(res.compiled[d] for d in mine)
        n = len(planned[i]) + in_memory[i]
        rows.append(WarmRow(spec, len(mine), n - len(mine), res.seconds, errors.get(i), compile_s, n))
    return rows, res.claimed, res.later


def _jit_row(store: Any, call: JitCall) -> WarmRow:
    from fa4cache.adapters.compile.warm_jit_calls import decode, resolve
    from fa4cache.adapters.compile.warm_specs import counted
    from fa4cache.adapters.fa4 import cross_compile
    from fa4cache.adapters.jit.jit_cache import fold_all_hits

    from fa4cache.store.runtime import record_spec

    # Without a GPU, kernels that ask the driver for the SM count (QuACK's GEMMs) get the target's.
    cross_compile.answer_hardware_queries()

    def run() -> None:
        fn = resolve(call.function)
        # The call's spec goes into its entries' sidecars: `warm --replay` compiles it again.
        with record_spec(call.to_dict()), quiet_library_warnings():
            fn(*decode(list(call.args)), **{k: decode(v) for k, v in call.kwargs})

    return row_of(call, counted(store, fold_all_hits, call.label(), run))


def _generation_row(store: Any, g: GenerationCall) -> WarmRow:
    from fa4cache.adapters.compile.generation import calls
    from fa4cache.adapters.compile.warm_specs import counted
    from fa4cache.adapters.fa4.compile_cache import ahead_off
    from fa4cache.adapters.patch import fold_all_hits

    from fa4cache.store.runtime import record_spec

    made = [0]

    def run() -> None:
        # quiet: fake tensors, torch's data-pointer warning is noise here
        with record_spec(g.to_dict()), quiet_library_warnings(), ahead_off():
            made[0] = calls(g)

    r = counted(store, fold_all_hits, g.label(), run)
    return row_of(g, r, kernels=made[0])
