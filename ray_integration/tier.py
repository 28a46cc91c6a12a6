"""The store's remote tier on a Ray cluster (:class:`ClusterTier`), and the check every
fetched copy passes (:func:`verified`). See :mod:`fa4cache.ray_integration.cluster`."""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import sys
import threading
import time
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
from fa4cache.store.tiers import Artifact, verify_copy

log = logging.getLogger(__name__)

RETRY_AFTER = 60.0  # seconds without cluster calls after a failure

_WAIT_SLICE = 5.0  # one registry wait; the lease is asked again after each

def _ray() -> Any | None:
    """Ray, if this process imported it and is connected; never imports or starts it."""
    ray = sys.modules.get("ray")
    try:
        return ray if ray is not None and ray.is_initialized() else None
    except Exception:
        return None

class ClusterTier:
    """The store's remote tier on a Ray cluster (see the module docstring)."""

    name = "cluster"

    def __init__(self, root: Path) -> None:
        # Cheap and Ray-free: the store is built in the worker setup hook and in processes
        # that never join a cluster; the first lookup connects. Bytes reach the cluster by
        # announcing local copies (served from ``root``), never by pushing.
        self.root = Path(root)
        self.last_fetch_seconds = 0.0
        self.last_source = ""  # the node the last fetch came from (a copy's provenance)
        self.lease_seconds = float(setting("FA4CACHE_CLUSTER_LEASE"))
        self.timeout = float(setting("FA4CACHE_CLUSTER_TIMEOUT"))
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._lock = threading.RLock()  # _connect may _fail while holding it
        self._registry: Any = None
        self._server: Any = None
        self._server_name = ""
        self._node = ""
        self._job = ""
        self._epoch: str | None = None
        self._down_until = 0.0
        self._warned = False
        self._warned_bad: set[str] = set()
        self._handles: dict[str, Any] = {}
        self._held: set[str] = set()
        self._renewer: threading.Thread | None = None
        self._wake = threading.Event()

    # -- connection -----------------------------------------------------------------
    def active(self) -> bool:
        return self._connect() is not None

    def served_since_last(self) -> int:
        return 0  # the node servers count what they serve, in their node's store

    def worker_env(self) -> dict[str, str]:
        return {}  # a compile server is no Ray worker: it compiles under the node's locks only

    def _connect(self) -> Any | None:
        if time.monotonic() < self._down_until:
            return None
        ray = _ray()
        if ray is None:
            return None
        with self._lock:
            if self._registry is not None:
                return self._registry
            try:
                self._registry = self._get_or_create(ray)
            except Exception as e:
                self._fail(e)
                return None
            return self._registry

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

    def _fail(self, e: BaseException) -> None:
        with self._lock:
            self._registry = None
            self._handles.clear()
            self._held.clear()
            self._down_until = time.monotonic() + RETRY_AFTER
            first = not self._warned
            self._warned = True
        if first:
            log.warning(
                "fa4cache: Ray cluster registry unreachable (%s: %s); compiling locally (shown once)",
                type(e).__name__,
                str(e).splitlines()[0][:200] if str(e) else "",
            )

    def _get(self, ref: Any, timeout: float | None = None) -> Any:
        ray = _ray()
        if ray is None:
            raise RuntimeError("not connected to Ray")
        return ray.get(ref, timeout=self.timeout if timeout is None else timeout)

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

    # -- the Tier protocol ------------------------------------------------------------
    def get(self, ref: EntryRef) -> Artifact | None:
        reg = self._connect()
        if reg is None:
            return None
        try:
            epoch, holders = self._get(reg.holders_of.remote(ref.digest))
        except Exception as e:
            self._fail(e)
            return None
        self._check_epoch(epoch)
        holders = [(s, n) for s, n in holders if s != self._server_name]
        random.shuffle(holders)  # spread the fetches of a new node over every copy
        for server, node in holders:
            t0 = time.perf_counter()
            try:
                got = self._get(self._handle(server).fetch.remote(ref.toolchain, ref.kind, ref.digest))
            except Exception as e:
                log.info("fa4cache: node %s did not serve %s (%s)", node[:12], ref.digest[:16], e)
                self._handles.pop(server, None)
                got = None
            art = verified(ref, got) if got is not None else None
            if art is None:
                if got is not None and ref.digest not in self._warned_bad:
                    self._warned_bad.add(ref.digest)
                    log.warning(
                        "fa4cache: node %s sent bytes for %s entry %s that do not match their "
                        "key or checksum; not loading them",
                        node[:12],
                        ref.kind,
                        ref.digest[:16],
                    )
                self._call_quiet(reg.forget.remote(ref.digest, server))
                continue
            self.last_fetch_seconds = time.perf_counter() - t0
            self.last_source = f"cluster node {node} ({server})"
            return art
        return None

    # -- leases and announcements (Store.acquire / Store.publish call these) --------------
    def acquire(self, digest: str, wait: float) -> bool:
        """Whether this process should compile ``digest`` holding the cluster lease. False:
        another node published it meanwhile (fetch it), or the cluster cannot say (compile
        without lease), or it waited ``wait`` seconds for another node's compile."""
        reg = self._connect()
        if reg is None:
            return False
        end = time.monotonic() + wait
        while True:
            try:
                epoch, status = self._get(
                    reg.lease.remote(digest, self.owner, self._node, self.lease_seconds, self._server_name)
                )
            except Exception as e:
                self._fail(e)
                return False
            self._check_epoch(epoch)
            if status == "granted":
                self._hold(digest)
                return True
            if status == "held":
                return False
            left = end - time.monotonic()
            if left <= 0:
                if wait > 0:
                    log.warning(
                        "fa4cache: another node has been compiling %s for over %.0f s; compiling here "
                        "too (raise FA4CACHE_LOCK_TIMEOUT if compiles take this long)",
                        digest[:16],
                        wait,
                    )
                return False
            slice_ = min(left, _WAIT_SLICE)
            try:
                self._get(reg.wait.remote(digest, slice_), timeout=slice_ + self.timeout)
            except Exception as e:
                self._fail(e)
                return False

    def release(self, digest: str) -> None:
        with self._lock:
            if digest not in self._held:
                return
            self._held.discard(digest)
            reg = self._registry
        if reg is not None:
            self._call_quiet(reg.release.remote(digest, self.owner))

    def announce(self, ref: EntryRef) -> None:
        reg = self._connect()
        if reg is None:
            return
        try:
            self._check_epoch(self._get(reg.announce.remote(ref.digest, self._server_name, self._node)))
        except Exception as e:
            self._fail(e)

    def _call_quiet(self, obj_ref: Any) -> None:
        try:
            self._get(obj_ref)
        except Exception as e:
            log.debug("fa4cache: registry call failed: %s", e)

    def _hold(self, digest: str) -> None:
        with self._lock:
            self._held.add(digest)
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_loop, name="fa4cache-lease", daemon=True)
                self._renewer.start()

    def _renew_loop(self) -> None:
        # Keeps the leases of compiles in progress alive; a process that dies stops renewing,
        # and its leases pass to a waiting node at their deadline.
        while True:
            self._wake.wait(self.lease_seconds / 3)
            with self._lock:
                held, reg = sorted(self._held), self._registry
            if held and reg is not None:
                self._call_quiet(reg.renew.remote(self.owner, held, self.lease_seconds))

def verified(ref: EntryRef, got: Any) -> Artifact | None:
    """An :class:`Artifact` if ``got`` is ``(sidecar bytes, data)`` for ``ref`` whose key text
    hashes to ``ref``'s digest and whose checksum and size match; None for anything else."""
    if not (isinstance(got, tuple) and len(got) == 2):
        return None
    return verify_copy(ref, got[0], got[1], tier="cluster")
