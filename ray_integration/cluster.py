"""Compile once per Ray job: a registry actor, a server actor per node, and the store tier.

``fa4cache.env(cache_dir, cluster=True)`` sets ``FA4CACHE_REMOTE_TIER`` to
:class:`~fa4cache.ray_integration.tier.ClusterTier`, so every worker's :class:`~fa4cache.store.Store` asks the cluster
after its own directory and its base stores. Three pieces, all of one job:

* :class:`~fa4cache.ray_integration.registry.Registry`, the named actor ``fa4cache-registry:<job id>`` (namespace ``fa4cache``,
  detached, on the head node, restarted by Ray if it crashes). It holds soft state only: which
  node servers of its job hold which entry digest, and who is compiling which digest (a *lease*
  with a deadline that its holder renews while it compiles). A lease passes to a waiting node
  when its holder's node is dead or its deadline passed. After a restart the registry is empty;
  nodes announce their inventories again when they notice (a new ``epoch``).
* :class:`~fa4cache.ray_integration.node_server.NodeServer`, one per node and store directory
  (``fa4cache-node:<job id>:<node>:<dir hash>``): serves the bytes of its node's local store,
  read and verified like any local load, and counts what it served. Every node that holds a
  copy announces it, so no kernel depends on one process staying alive.
* :class:`~fa4cache.ray_integration.tier.ClusterTier`, the remote tier in each worker. On a local miss it asks the registry
  for holders, fetches from one (trying the next on any failure) and verifies the bytes against
  the sidecar that came with them, and the sidecar's key text against the digest it asked for;
  the store publishes them locally (and this node becomes a holder) before they load. Before a
  compile, :meth:`~fa4cache.ray_integration.tier.ClusterTier.acquire` takes the lease or waits for the node that has it.

Every Ray call has a timeout (``FA4CACHE_CLUSTER_TIMEOUT``). Any failure to reach the registry
means a local compile, one warning per process, and no cluster calls for a minute; nothing
waits longer than the store's own lock timeout. Processes without ``FA4CACHE_REMOTE_TIER``, or
not connected to Ray, never touch any of this.

Trust: the job is the trust boundary. Whoever can submit this job's code runs it on every node
already. Actors of other jobs are not: the registry and servers are named for their job and
end with it (:func:`~fa4cache.ray_integration.actors.end_with_job`, within seconds, a driver killed with SIGKILL too), the
registry takes announcements only from server names of its job, and a worker talks only to
actors that its own job created (Ray's actor ids name the creating job), so an earlier job's
leftovers, or another user's actor that took one of these names first, never serve this one.
Kernels persist across jobs in the node-local stores on disk, which each job's servers serve.
Within a job, checksums and the key check catch corruption and bytes filed under another key;
a peer of the same job that compiles wrong bytes for the right key is not caught (provenance in
each copy's sidecar says which node and process it came from).

The pieces live in :mod:`.actors` (names, lifetime), :mod:`.registry`, :mod:`.node_server`,
:mod:`.tier` and :mod:`.admin`; this module is the cluster's one import for callers, and
``fa4cache.ray_integration.cluster:ClusterTier``, the ``FA4CACHE_REMOTE_TIER`` value jobs
already carry, keeps naming the tier.
"""

from __future__ import annotations

from fa4cache.ray_integration.actors import NAMESPACE, actor_job, registry_name, server_prefix
from fa4cache.ray_integration.admin import registry_info, shutdown
from fa4cache.ray_integration.tier import ClusterTier, verified

__all__ = [
    "NAMESPACE",
    "ClusterTier",
    "actor_job",
    "registry_info",
    "registry_name",
    "server_prefix",
    "shutdown",
    "verified",
]
