"""Operator calls on a connected Ray: this job's registry counts, and killing every job's
fa4cache actors."""

from __future__ import annotations

import logging
from typing import Any

from fa4cache.ray_integration.actors import NAMESPACE, REGISTRY, SERVER_PREFIX, registry_name

log = logging.getLogger(__name__)


def shutdown() -> int:
    """Kill every job's registry and node servers now (they also end with their job);
    returns how many actors were killed. Needs a connected Ray."""
    import ray

    n = 0
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a.get("namespace") == NAMESPACE and (
            a["name"].startswith(REGISTRY) or a["name"].startswith(SERVER_PREFIX)
        ):
            try:
                ray.kill(ray.get_actor(a["name"], namespace=NAMESPACE), no_restart=True)
                n += 1
            except Exception:
                pass
    return n


def registry_info(timeout: float = 10.0) -> dict[str, Any] | None:
    """This job's registry's counts (digests, copies, leases granted, handovers, refused
    announcements), or None."""
    import ray

    try:
        name = registry_name(ray.get_runtime_context().get_job_id())
        return ray.get(ray.get_actor(name, namespace=NAMESPACE).info.remote(), timeout=timeout)
    except Exception:
        return None
