"""Compile once per Ray job: a registry actor, a server actor per node, and the store tier.

``fa4cache.env(cache_dir, cluster=True)`` sets ``FA4CACHE_REMOTE_TIER`` to
:class:`ClusterTier`, so every worker's :class:`~fa4cache.store.Store` asks the cluster
after its own directory and its base stores. Three pieces, all of one job:

* :class:`Registry`, the named actor ``fa4cache-registry:<job id>`` (namespace ``fa4cache``,
  detached, on the head node, restarted by Ray if it crashes). It holds soft state only: which
  node servers of its job hold which entry digest, and who is compiling which digest (a *lease*
  with a deadline that its holder renews while it compiles). A lease passes to a waiting node
  when its holder's node is dead or its deadline passed. After a restart the registry is empty;
  nodes announce their inventories again when they notice (a new ``epoch``).
* :class:`NodeServer`, one per node and store directory
  (``fa4cache-node:<job id>:<node>:<dir hash>``): serves the bytes of its node's local store,
  read and verified like any local load, and counts what it served. Every node that holds a
  copy announces it, so no kernel depends on one process staying alive.
* :class:`ClusterTier`, the remote tier in each worker. On a local miss it asks the registry
  for holders, fetches from one (trying the next on any failure) and verifies the bytes against
  the sidecar that came with them, and the sidecar's key text against the digest it asked for;
  the store publishes them locally (and this node becomes a holder) before they load. Before a
  compile, :meth:`ClusterTier.acquire` takes the lease or waits for the node that has it.

Every Ray call has a timeout (``FA4CACHE_CLUSTER_TIMEOUT``). Any failure to reach the registry
means a local compile, one warning per process, and no cluster calls for a minute; nothing
waits longer than the store's own lock timeout. Processes without ``FA4CACHE_REMOTE_TIER``, or
not connected to Ray, never touch any of this.

Trust: the job is the trust boundary. Whoever can submit this job's code runs it on every node
already. Actors of other jobs are not: the registry and servers are named for their job and
end with it (:func:`end_with_job`, within seconds, a driver killed with SIGKILL too), the
registry takes announcements only from server names of its job, and a worker talks only to
actors that its own job created (Ray's actor ids name the creating job), so an earlier job's
leftovers, or another user's actor that took one of these names first, never serve this one.
Kernels persist across jobs in the node-local stores on disk, which each job's servers serve.
Within a job, checksums and the key check catch corruption and bytes filed under another key;
a peer of the same job that compiles wrong bytes for the right key is not caught (provenance in
each copy's sidecar says which node and process it came from).
"""

from __future__ import annotations

import asyncio
import hashlib
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

from fa4cache.settings import setting
from fa4cache.store.paths import EntryRef
from fa4cache.store.tiers import Artifact, verify_copy

log = logging.getLogger(__name__)

NAMESPACE = "fa4cache"
REGISTRY = "fa4cache-registry"
SERVER_PREFIX = "fa4cache-node:"
HEAD_RESOURCE = "node:__internal_head__"
RETRY_AFTER = 60.0  # seconds without cluster calls after a failure
_WAIT_SLICE = 5.0  # one registry wait; the lease is asked again after each
JOB_WATCH_SECONDS = 5.0  # how often a registry or server checks that its job still runs


def _now() -> float:
    return time.time()


class Registry:
    """Who holds which digest, who compiles which: the cluster's soft state (an async actor)."""

    def __init__(self) -> None:
        import ray

        self.epoch = secrets.token_hex(8)
        # Holders are servers of this job only: any actor of the namespace could be named here.
        self.prefix = server_prefix(ray.get_runtime_context().get_job_id())
        self.refused = 0
        end_with_job()
        self.holders: dict[str, dict[str, str]] = {}  # digest -> {server name: node id}
        self.leases: dict[str, tuple[str, str, float]] = {}  # digest -> (owner, node id, deadline)
        self.events: dict[str, asyncio.Event] = {}
        self.granted = 0
        self.handovers = 0
        self._alive: set[str] = set()
        self._alive_at = 0.0

    # -- liveness -----------------------------------------------------------------
    def _alive_nodes(self) -> set[str]:
        import ray

        if time.monotonic() - self._alive_at > 0.5:
            self._alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            self._alive_at = time.monotonic()
        return self._alive

    def _live_holders(self, digest: str) -> list[tuple[str, str]]:
        alive = self._alive_nodes()
        return [(s, n) for s, n in self.holders.get(digest, {}).items() if n in alive]

    def _changed(self, digest: str) -> None:
        ev = self.events.pop(digest, None)
        if ev is not None:
            ev.set()

    # -- lookups ------------------------------------------------------------------
    async def holders_of(self, digest: str) -> tuple[str, list[tuple[str, str]]]:
        return self.epoch, self._live_holders(digest)

    async def forget(self, digest: str, server: str) -> None:
        """A holder that could not serve ``digest`` (dead, or its copy failed verification)."""
        self.holders.get(digest, {}).pop(server, None)

    async def announce(self, digest: str, server: str, node: str) -> str:
        if not server.startswith(self.prefix):
            self.refused += 1  # another job's server, or an actor that is none
            return self.epoch
        self.holders.setdefault(digest, {})[server] = node
        self.leases.pop(digest, None)  # a holder makes the lease moot
        self._changed(digest)
        return self.epoch

    async def announce_many(self, server: str, node: str, digests: list[str]) -> int:
        for d in digests:
            await self.announce(d, server, node)
        return len(digests)

    # -- leases -------------------------------------------------------------------
    async def lease(
        self, digest: str, owner: str, node: str, ttl: float, server: str = ""
    ) -> tuple[str, str]:
        """``granted`` (compile it), ``held`` (fetch it: another live holder has it) or ``busy``.
        The asker's own server does not count: if it is listed, its copy is gone (pruned)."""
        if [h for h in self._live_holders(digest) if h[0] != server]:
            return self.epoch, "held"
        cur = self.leases.get(digest)
        if cur is not None and cur[0] != owner:
            owner0, node0, deadline = cur
            if _now() < deadline and node0 in self._alive_nodes():
                return self.epoch, "busy"
            self.handovers += 1  # its holder died or stopped renewing: the job passes on
        self.leases[digest] = (owner, node, _now() + ttl)
        self.granted += 1
        return self.epoch, "granted"

    async def renew(self, owner: str, digests: list[str], ttl: float) -> int:
        n = 0
        for d in digests:
            cur = self.leases.get(d)
            if cur is not None and cur[0] == owner:
                self.leases[d] = (owner, cur[1], _now() + ttl)
                n += 1
        return n

    async def release(self, digest: str, owner: str) -> None:
        cur = self.leases.get(digest)
        if cur is not None and cur[0] == owner:
            del self.leases[digest]
            self._changed(digest)

    async def wait(self, digest: str, timeout: float) -> None:
        """Return when ``digest`` gets a holder or loses its lease, or after ``timeout``."""
        ev = self.events.setdefault(digest, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def info(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "digests": len(self.holders),
            "copies": sum(len(h) for h in self.holders.values()),
            "leases": len(self.leases),
            "granted": self.granted,
            "handovers": self.handovers,
            "refused": self.refused,
        }


class NodeServer:
    """Serves this node's copies of kernels to other nodes (verified, counted)."""

    def __init__(self, root: str) -> None:
        from fa4cache.settings import Settings
        from fa4cache.store.store import Store

        # Its own store on the same directory, without a remote tier: a server never asks
        # the cluster for anything.
        self.store = Store(Settings.from_env(root, remote_tier=None))
        end_with_job()
        self.announce_inventory()

    def fetch(self, toolchain: str, kind: str, digest: str) -> tuple[bytes, bytes] | None:
        """The sidecar and artifact bytes of a local entry that verifies; None otherwise
        (a corrupt entry is quarantined here by the local tier, and never sent)."""
        local = self.store.local
        art = local.get(EntryRef(toolchain, kind, digest)) if local is not None else None
        if art is None:
            return None
        self.store.counters.add("served")
        self.store.counters.flush()
        return art.sidecar.to_bytes(), art.data

    def inventory(self) -> list[str]:
        return [e.ref.digest for e in self.store.layout.iter_entries()]

    def announce_inventory(self) -> int:
        import ray

        try:
            reg = ray.get_actor(registry_name(ray.get_runtime_context().get_job_id()), namespace=NAMESPACE)
            name = ray.get_runtime_context().get_actor_name() or ""
            node = ray.get_runtime_context().get_node_id()
            return int(
                ray.get(
                    reg.announce_many.remote(name, node, self.inventory()),
                    timeout=setting("FA4CACHE_CLUSTER_TIMEOUT"),
                )
            )
        except Exception as e:  # no registry yet: it asks again when a tier sees a new epoch
            log.info("fa4cache: node server could not announce its inventory (%s)", e)
            return 0


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
