"""The node server actor: serves the bytes of its node's local store, read and verified like
any local load, and announces its inventory to the job's registry."""

from __future__ import annotations

import logging

from fa4cache.ray_integration.actors import NAMESPACE, end_with_job, registry_name

from fa4cache.settings import setting
from fa4cache.store.paths import EntryRef

log = logging.getLogger(__name__)


class NodeServer:
    """Serves this node's copies of kernels to other nodes (verified, counted)."""

    def __init__(self, root: str) -> None:
        from fa4cache.settings import Settings
        from fa4cache.store.store import Store

        # The node's store, opened in this actor's process without a remote tier: a server
        # only reads its node's verified copies (Store.serve), and never asks the cluster.
        self.store = Store(Settings.from_env(root, remote_tier=None))
        end_with_job()
        self.announce_inventory()

    def fetch(self, toolchain: str, kind: str, digest: str) -> tuple[bytes, bytes] | None:
        """The sidecar and artifact bytes of a local entry that verifies; None otherwise
        (a corrupt entry is quarantined here by the local tier, and never sent)."""
        art = self.store.serve(EntryRef(toolchain, kind, digest))
        if art is None:
            return None
        self.store.counters.add("served")
        self.store.counters.flush()
        return art.sidecar.to_bytes(), art.data

    def inventory(self) -> list[str]:
        return [e.ref.digest for e in self.store.entries()]

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
