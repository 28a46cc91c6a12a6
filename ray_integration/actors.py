"""The names and lifetime of fa4cache's Ray actors: one registry and one server per node
and store directory for each job, named for the job and ended with it."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

NAMESPACE = "fa4cache"

REGISTRY = "fa4cache-registry"

SERVER_PREFIX = "fa4cache-node:"

HEAD_RESOURCE = "node:__internal_head__"

JOB_WATCH_SECONDS = 5.0  # how often a registry or server checks that its job still runs


def _now() -> float:
    return time.time()


def registry_name(job_id: str) -> str:
    return f"{REGISTRY}:{job_id}"


def server_prefix(job_id: str) -> str:
    return f"{SERVER_PREFIX}{job_id}:"


def server_name(node_id: str, root: os.PathLike[str] | str, job_id: str) -> str:
    return f"{server_prefix(job_id)}{node_id}:{hashlib.sha256(os.fspath(root).encode()).hexdigest()[:12]}"


def actor_job(handle: Any) -> str | None:
    """The job that created the actor behind ``handle`` (Ray's actor ids embed it)."""
    try:
        return handle._actor_id.job_id.hex()
    except Exception:
        return None


def _job_over(job_id: str) -> bool:
    try:
        from ray._private.state import state

        return any(j.get("JobID") == job_id and j.get("IsDead") for j in state.job_table())
    except Exception:  # cannot tell: keep serving (the cluster going away ends us anyway)
        return False


def end_with_job(every: float = JOB_WATCH_SECONDS) -> None:
    """Kill this (detached) actor, without restart, once the job that made it is over,
    however it ended (a driver killed with SIGKILL too): a later job gets servers of its own
    and never an earlier job's leftovers."""
    import ray

    ctx = ray.get_runtime_context()
    job, me = ctx.get_job_id(), ctx.current_actor

    def watch() -> None:
        while not _job_over(job):
            time.sleep(every)
        log.info("fa4cache: job %s is over; %s exits", job, ctx.get_actor_name())
        ray.kill(me, no_restart=True)

    threading.Thread(target=watch, name="fa4cache-job-watch", daemon=True).start()
