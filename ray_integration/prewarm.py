"""Compile kernel specs into every node's store before training actors start: one task per
node runs the warm runner (``fa4cache.warm``), each compiling everything, or, with
``split=True``, its share of the kernels, taking the rest from the other nodes."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from fa4cache.adapters.compile.report import WarmReport

from fa4cache.aot.plan import WarmPlan
from fa4cache.aot.spec import KernelSpec

log = logging.getLogger(__name__)

# Deprecated name of a node's report: prewarm returns the runner's WarmReport (same fields).
NodeReport = WarmReport


def _warm_on_node(plan: WarmPlan, where: tuple[int, int] | None) -> WarmReport:
    # Runs inside a Ray task; the runtime_env's env_vars carry the cache settings.
    import os

    import ray
    from fa4cache.adapters.compile.runner import warm

    report = warm(plan, split=where if where is not None else False)
    node = ray.get_runtime_context().get_node_id()
    return dataclasses.replace(report, node_id=node, cache_dir=os.environ.get("FA4CACHE_DIR"))


def prewarm(
    specs: list[KernelSpec | dict[str, Any]],
    *,
    nodes: list[str] | None = None,
    num_cpus: float = 1,
    split: bool = False,
) -> dict[str, WarmReport]:
    """Run one task per alive node (or per id in ``nodes``) that compiles ``specs`` into
    that node's store. Needs no GPU. Returns ``{node_id: WarmReport}`` (``compiled``,
    ``present``, ``failed``, ``cache_dir``); a node whose task failed reports the failure
    instead of raising. ``split``: each node compiles about its share of the kernels and
    fetches the rest from the others (a job started with ``fa4cache.env(..., cluster=True)``);
    without it every node compiles every kernel."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    plan = WarmPlan.of(s if isinstance(s, KernelSpec) else KernelSpec.from_dict(s) for s in specs)
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    targets = alive if nodes is None else [n for n in nodes if n in alive]
    missing = [] if nodes is None else [n for n in nodes if n not in alive]
    task = ray.remote(_warm_on_node)
    refs = {
        node: task.options(
            num_cpus=num_cpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        ).remote(plan, (i, len(targets)) if split else None)
        for i, node in enumerate(targets)
    }
    reports: dict[str, WarmReport] = {}
    for node, ref in refs.items():
        try:
            reports[node] = ray.get(ref)
        except Exception as e:
            reports[node] = WarmReport(plan.target, node_id=node, error=f"{type(e).__name__}: {e}")
    for node in missing:
        reports[node] = WarmReport(plan.target, node_id=node, error="node is not alive")
    return reports
