"""Compile kernel specs into every node's store before training actors start."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fa4cache.aot.spec import KernelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeReport:
    node_id: str
    cache_dir: str | None
    compiled: int = 0
    present: int = 0
    failed: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def _warm_on_node(spec_dicts: list[dict[str, Any]]) -> dict[str, Any]:
    # Runs inside a Ray task; the runtime_env's env_vars carry the cache settings.
    import os

    from fa4cache.adapters.compile import set_cross_compile_env, warm

    from fa4cache.aot.spec import KernelSpec

    specs = [KernelSpec.from_dict(d) for d in spec_dicts]
    if specs:
        set_cross_compile_env(specs[0].arch)
    results = warm(specs)
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "cache_dir": os.environ.get("FA4CACHE_DIR"),
        "compiled": sum(r.compiles for r in results),
        "present": sum(r.present for r in results),
        "failed": [(r.spec.label(), r.error) for r in results if r.error],
    }


def prewarm(
    specs: list[KernelSpec | dict[str, Any]], *, nodes: list[str] | None = None, num_cpus: float = 1
) -> dict[str, NodeReport]:
    """Run one task per alive node (or per id in ``nodes``) that compiles ``specs`` into
    that node's store. Needs no GPU. Returns ``{node_id: NodeReport}``; a node whose
    task failed reports the failure instead of raising."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec_dicts = [
        s.to_dict() if isinstance(s, KernelSpec) else KernelSpec.from_dict(s).to_dict() for s in specs
    ]
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    targets = alive if nodes is None else [n for n in nodes if n in alive]
    missing = [] if nodes is None else [n for n in nodes if n not in alive]
    task = ray.remote(_warm_on_node)
    refs = {
        node: task.options(
            num_cpus=num_cpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        ).remote(spec_dicts)
        for node in targets
    }
    reports: dict[str, NodeReport] = {}
    for node, ref in refs.items():
        try:
            r = ray.get(ref)
            reports[node] = NodeReport(
                node_id=node,
                cache_dir=r["cache_dir"],
                compiled=r["compiled"],
                present=r["present"],
                failed=tuple((a, b) for a, b in r["failed"]),
            )
        except Exception as e:
            reports[node] = NodeReport(
                node_id=node, cache_dir=None, failed=(("*", f"{type(e).__name__}: {e}"),)
            )
    for node in missing:
        reports[node] = NodeReport(node_id=node, cache_dir=None, failed=(("*", "node is not alive"),))
    return reports
