"""The registry actor of a job: which node servers hold which entry digest, and who is
compiling which digest (a lease with a deadline its holder renews). Soft state only; see
:mod:`fa4cache.ray_integration.cluster` for the design."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from fa4cache.ray_integration.actors import _now, end_with_job, server_prefix

log = logging.getLogger(__name__)


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
