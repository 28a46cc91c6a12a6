"""The store's remote tier on a Ray cluster (:class:`ClusterTier`): the leased tier of
:mod:`fa4cache.store.remote` over :class:`RayTransport` (the job's registry and node server
actors), and the check every fetched copy passes (:func:`verified`). See
:mod:`fa4cache.ray_integration.cluster`."""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fa4cache.ray_integration.actors import (
    HEAD_RESOURCE,
    NAMESPACE,
    actor_job,
    registry_name,
    server_name,
    server_prefix,
)
from fa4cache.ray_integration.node_server import NodeServer
from fa4cache.ray_integration.registry import Registry

from fa4cache.settings import setting
from fa4cache.store.paths import EntryRef
from fa4cache.store.remote import BUSY, GRANTED, HELD, Check, Copy, LeasedTier, Warn
from fa4cache.store.tiers import Artifact, verify_copy

log = logging.getLogger(__name__)

_WAIT_SLICE = 5.0  # one registry wait; the lease is asked again after each


def _ray() -> Any | None:
    """Ray, if this process imported it and is connected; never imports or starts it."""
    ray = sys.modules.get("ray")
    try:
        return ray if ray is not None and ray.is_initialized() else None
    except Exception:
        return None


class ClusterTier(LeasedTier):
    """The store's remote tier on a Ray cluster (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, RayTransport)


class RayTransport:
    """Copies and leases through the job's registry actor and node server actors.

    Cheap and Ray-free until :meth:`connect`: the store is built in the worker setup hook and
    in processes that never join a cluster. Bytes reach the cluster by announcing local copies
    (the node server serves them from ``root``), never by pushing.
    """

    name = "cluster"
    peer = "node"
    unreachable = "fa4cache: Ray cluster registry unreachable ({error}); compiling locally (shown once)"
    bad_copy = (
        "fa4cache: {source} sent bytes for {kind} entry {digest} that do not match their key or "
        "checksum; not loading them"
    )

    def __init__(self, root: Path, warn: Warn) -> None:
        self.root = Path(root)
        self.timeout = float(setting("FA4CACHE_CLUSTER_TIMEOUT"))
        self.lease_seconds = float(setting("FA4CACHE_CLUSTER_LEASE"))
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._registry: Any = None
        self._server: Any = None
        self._server_name = ""
        self._node = ""
        self._job = ""
        self._epoch: str | None = None
        self._handles: dict[str, Any] = {}

    # -- connection ---------------------------------------------------------------------
    def connect(self) -> Any | None:
        ray = _ray()
        if ray is None:
            return None
        if self._registry is None:
            self._registry = self._get_or_create(ray)
        return self._registry

    def disconnect(self) -> None:
        self._registry = None
        self._handles.clear()

    def _get_or_create(self, ray: Any) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._node = ray.get_runtime_context().get_node_id()
        self._job = ray.get_runtime_context().get_job_id()
        registry = (
            ray.remote(Registry)
            .options(
                name=registry_name(self._job),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                resources={HEAD_RESOURCE: 0.001},  # dies only with the cluster
                max_restarts=-1,
                max_concurrency=1000,
            )
            .remote()
        )
        self._server_name = server_name(self._node, self.root, self._job)
        self._server = (
            ray.remote(NodeServer)
            .options(
                name=self._server_name,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=4,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self._node, soft=False),
            )
            .remote(str(self.root))
        )
        for name, h in ((registry_name(self._job), registry), (self._server_name, self._server)):
            self._own(name, h)  # get_if_exists hands back whoever took the name first
        return registry

    def _own(self, name: str, handle: Any) -> None:
        """Refuse an actor of that name that another job created (names are cluster-wide)."""
        job = actor_job(handle)
        if job != self._job:
            raise RuntimeError(f"actor {name} belongs to job {job}, not to this job {self._job}")

    def _get(self, ref: Any, timeout: float | None = None) -> Any:
        ray = _ray()
        if ray is None:
            raise RuntimeError("not connected to Ray")
        return ray.get(ref, timeout=self.timeout if timeout is None else timeout)

    def _call_quiet(self, obj_ref: Any) -> None:
        try:
            self._get(obj_ref)
        except Exception as e:
            log.debug("fa4cache: registry call failed: %s", e)

    def _check_epoch(self, epoch: str) -> None:
        # A registry this process has not seen (first contact, or a restart that lost its
        # state): our node announces what it holds (idempotent, one directory walk).
        if epoch != self._epoch:
            if self._server is not None:
                try:
                    self._server.announce_inventory.remote()
                except Exception:
                    pass
            self._epoch = epoch

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            import ray

            if not name.startswith(server_prefix(self._job)):
                raise RuntimeError(f"{name} is not a node server of this job")
            h = ray.get_actor(name, namespace=NAMESPACE)
            self._own(name, h)
            self._handles[name] = h
        return h

    # -- copies -------------------------------------------------------------------------------
    def fetch(self, ref: EntryRef, check: Check) -> Artifact | None:
        reg = self._registry
        epoch, holders = self._get(reg.holders_of.remote(ref.digest))
        self._check_epoch(epoch)
        holders = [(s, n) for s, n in holders if s != self._server_name]
        random.shuffle(holders)  # spread the fetches of a new node over every copy
        for server, node in holders:
            try:
                got = self._get(self._handle(server).fetch.remote(ref.toolchain, ref.kind, ref.digest))
            except Exception as e:  # this holder only: the next may serve
                log.info("fa4cache: node %s did not serve %s (%s)", node[:12], ref.digest[:16], e)
                self._handles.pop(server, None)
                continue
            art = None
            if got is not None:
                side, data = got if isinstance(got, tuple) and len(got) == 2 else (b"", b"")
                art = check(Copy(f"cluster node {node} ({server})", side, data))
            if art is not None:
                return art
            self._call_quiet(reg.forget.remote(ref.digest, server))  # gone, or a bad copy
        return None

    def offer(self, ref: EntryRef, copy: Callable[[], Artifact | None]) -> bool:
        # The node server serves the copy from this node's store: only say that it is here.
        self._check_epoch(
            self._get(self._registry.announce.remote(ref.digest, self._server_name, self._node))
        )
        return False

    def served(self) -> int | None:
        return None  # the node servers count what they serve, in their node's store

    def worker_env(self) -> dict[str, str]:
        return {}  # a compile server is no Ray worker: it compiles under the node's locks only

    # -- leases ---------------------------------------------------------------------------------
    def lease(self, digest: str) -> tuple[str, Any]:
        epoch, status = self._get(
            self._registry.lease.remote(digest, self.owner, self._node, self.lease_seconds, self._server_name)
        )
        self._check_epoch(epoch)
        return {"granted": GRANTED, "held": HELD}.get(status, BUSY), self.owner

    def wait(self, digest: str, seconds: float, attempt: int) -> None:
        slice_ = min(seconds, _WAIT_SLICE)
        self._get(self._registry.wait.remote(digest, slice_), timeout=slice_ + self.timeout)

    def renew(self, held: dict[str, Any]) -> dict[str, Any]:
        reg = self._registry
        if reg is not None:
            self._call_quiet(reg.renew.remote(self.owner, sorted(held), self.lease_seconds))
        return {}  # the owner names every lease of ours: nothing to replace

    def release(self, digest: str, token: Any) -> None:
        reg = self._registry
        if reg is not None:
            self._call_quiet(reg.release.remote(digest, token))


def verified(ref: EntryRef, got: Any) -> Artifact | None:
    """An :class:`Artifact` if ``got`` is ``(sidecar bytes, data)`` for ``ref`` whose key text
    hashes to ``ref``'s digest and whose checksum and size match; None for anything else."""
    if not (isinstance(got, tuple) and len(got) == 2):
        return None
    return verify_copy(ref, got[0], got[1], tier="cluster")
