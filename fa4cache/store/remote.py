"""The leased remote tier, written once: what every job-wide tier does whatever carries its bytes.

A :class:`LeasedTier` is the store's remote tier (:class:`~fa4cache.store.tiers.RemoteTier`)
for one engine, over a small :class:`Transport` that only moves things: candidate copies of
an entry (``fetch``), this node's copy (``offer``), and a key's compile lease (``lease``,
``renew``, ``release``, ``wait``). The Ray transport lives in ``fa4cache.ray_integration``,
the torch.distributed one (the job's c10d store) in ``fa4cache.adapters.distributed``.
Everything else is here, once:

* **Verification.** A copy loads only if :func:`~fa4cache.store.tiers.verify_copy` accepts it:
  its sidecar names ``ref``, its key text hashes to ``ref``'s digest, its bytes match the
  sidecar's size and sha256. A transport may refuse a copy before that (the c10d store's
  HMAC of :mod:`fa4cache.store.auth`: :attr:`Copy.refused`); each refusal warns once per key.
* **Back-off.** Any transport error drops the connection, warns once, and makes the tier a
  miss / "compile it here" for :data:`RETRY_AFTER` seconds.
* **The acquire loop.** Lease, or wait for the node that has it, until the caller's deadline;
  then one warning and a compile here.
* **Lease renewal.** One daemon thread renews this process's leases every third of
  ``FA4CACHE_CLUSTER_LEASE`` while their compiles run; a process that dies stops renewing,
  and its leases pass on at their deadline.
* **Provenance and counts.** :attr:`LeasedTier.last_source` and ``last_fetch_seconds`` of the
  last fetch; copies fetched, uploaded, leases taken over; copies others fetched from ours.

Transports, and the names that pick them: the store never names one. ``FA4CACHE_REMOTE_TIER``
names a ``module:Class`` (the Ray tier), and an engine's package registers its tier under a
name (:func:`register_tier`: ``FA4CACHE_DISTRIBUTED=1`` picks ``"distributed"``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fa4cache.settings import setting

from .paths import EntryRef
from .tiers import Artifact, RemoteTier, verify_copy

log = logging.getLogger(__name__)

RETRY_AFTER = 60.0  # seconds without transport calls after a failure

# What Transport.lease answers.
GRANTED = "granted"  # this process compiles, holding the lease
TAKEN_OVER = "taken over"  # granted, from a holder that died or stopped renewing
HELD = "held"  # a copy exists: fetch it
BUSY = "busy"  # another process holds the lease: wait


@dataclass(frozen=True)
class Copy:
    """A candidate copy of an entry, as a transport received it; not believed yet."""

    source: str  # where it came from, in words (a node, a rank): the copy's provenance
    sidecar: bytes
    data: bytes
    refused: str = ""  # the transport's own check failed (a MAC): this warning, not loaded


class Serves(Protocol):
    """What the tier needs of its store (:meth:`fa4cache.store.store.Store.serve`)."""

    def serve(self, ref: EntryRef) -> Artifact | None: ...


Warn = Callable[[str, str], None]  # (tag, message): warned once per tag
Check = Callable[[Copy], "Artifact | None"]


class Transport(Protocol):
    """What carries one engine's copies and leases. Every method may raise: the tier then
    backs off (see the module docstring); none of them retries or warns about failures."""

    name: str  # the tier's name (an Artifact's ``tier``)
    peer: str  # what the other processes of a job are called, in warnings ("node", "rank")
    unreachable: str  # warning when a call fails; ``{error}`` is the failure
    bad_copy: str  # warning for a copy that fails verification; ``{source}``, ``{kind}``, ``{digest}``

    def connect(self) -> Any | None:
        """The connection (connecting if needed), or None outside a job."""
        ...

    def disconnect(self) -> None:
        """Forget the connection and everything learnt over it (after a failure)."""
        ...

    def fetch(self, ref: EntryRef, check: Check) -> Artifact | None:
        """Hand each candidate copy of ``ref`` to ``check`` until one passes; that one's
        Artifact, or None. A copy that does not pass is the transport's to forget."""
        ...

    def offer(self, ref: EntryRef, copy: Callable[[], Artifact | None]) -> bool:
        """This node holds ``ref`` (``copy()`` reads its verified bytes): announce or upload
        it. True if bytes were uploaded."""
        ...

    def lease(self, digest: str) -> tuple[str, Any]:
        """(:data:`GRANTED`, :data:`TAKEN_OVER`, :data:`HELD` or :data:`BUSY`, the token that
        renews and releases a granted lease)."""
        ...

    def wait(self, digest: str, seconds: float, attempt: int) -> None:
        """Wait up to ``seconds`` for the lease of ``digest`` to change (``attempt``: how many
        waits this acquire made already)."""
        ...

    def renew(self, held: dict[str, Any]) -> dict[str, Any]:
        """Extend the leases ``held`` (digest -> token); the new tokens of those that changed."""
        ...

    def release(self, digest: str, token: Any) -> None:
        """End the lease ``token`` of ``digest`` (if still connected)."""
        ...

    def served(self) -> int | None:
        """How many copies other processes fetched from this node's uploads so far (a running
        total); None when it cannot say without a new connection."""
        ...

    def worker_env(self) -> dict[str, str]:
        """Environment for this process's compile server (connected): {} if none."""
        ...


class LeasedTier:
    """The store's remote tier over one :class:`Transport` (see the module docstring).

    Built as ``Class(root)`` by the store, cheaply: nothing connects until the first lookup,
    and a process that never joins a job never does. The store then attaches itself
    (:meth:`attach`): this node's copies are read through it.
    """

    name = "remote"

    def __init__(self, root: Path, transport: Callable[[Path, Warn], Transport]) -> None:
        self.root = Path(root)
        self.last_fetch_seconds = 0.0  # how long the last successful get took
        self.last_source = ""  # where its bytes came from: the copy's provenance
        self.lease_seconds = float(setting("FA4CACHE_CLUSTER_LEASE"))
        self.fetched = 0
        self.uploaded = 0
        self.handovers = 0
        self._lock = threading.RLock()  # connect may fail (and _fail) while holding it
        self._down_until = 0.0
        self._warned: set[str] = set()
        self._held: dict[str, Any] = {}  # digest -> the transport's token of our lease
        self._renewer: threading.Thread | None = None
        self._wake = threading.Event()
        self._served_seen = 0
        self._store: Serves | None = None
        self.transport = transport(self.root, self._warn)
        self.name = self.transport.name

    def attach(self, store: Serves) -> None:
        """The store this tier serves: :meth:`announce` reads this node's copy through it."""
        self._store = store

    # -- connection and back-off ------------------------------------------------------
    def active(self) -> bool:
        return self._connect() is not None

    def _connect(self) -> Any | None:
        if time.monotonic() < self._down_until:
            return None
        with self._lock:
            try:
                return self.transport.connect()
            except Exception as e:
                self._fail(e)
                return None

    def _fail(self, e: BaseException) -> None:
        with self._lock:
            try:
                self.transport.disconnect()
            finally:
                self._held.clear()
                self._down_until = time.monotonic() + RETRY_AFTER
        first_line = str(e).splitlines()[0][:200] if str(e) else ""
        self._warn("down", self.transport.unreachable.format(error=f"{type(e).__name__}: {first_line}"))

    def _warn(self, tag: str, message: str) -> None:
        with self._lock:
            if tag in self._warned:
                return
            self._warned.add(tag)
        log.warning(message)

    # -- the Tier protocol ---------------------------------------------------------------
    def get(self, ref: EntryRef) -> Artifact | None:
        if self._connect() is None:
            return None
        t0 = time.perf_counter()
        took: list[Copy] = []

        def check(copy: Copy) -> Artifact | None:
            art = self._verified(ref, copy)
            if art is not None:
                took.append(copy)
            return art

        try:
            art = self.transport.fetch(ref, check)
        except Exception as e:
            self._fail(e)
            return None
        if art is None or not took:
            return None
        self.last_fetch_seconds = time.perf_counter() - t0
        self.last_source = took[-1].source
        self.fetched += 1
        return art

    def _verified(self, ref: EntryRef, copy: Copy) -> Artifact | None:
        if copy.refused:
            self._warn(f"bad:{ref.digest}", copy.refused)
            return None
        art = verify_copy(ref, copy.sidecar, copy.data, tier=self.name)
        if art is None:
            self._warn(
                f"bad:{ref.digest}",
                self.transport.bad_copy.format(source=copy.source, kind=ref.kind, digest=ref.digest[:16]),
            )
        return art

    def announce(self, ref: EntryRef) -> None:
        """This node now holds a verified copy of ``ref``: offered to the job."""
        if self._connect() is None:
            return
        store = self._store
        try:
            if self.transport.offer(ref, lambda: store.serve(ref) if store is not None else None):
                self.uploaded += 1
        except Exception as e:
            self._fail(e)

    # -- leases ------------------------------------------------------------------------------
    def acquire(self, digest: str, wait: float) -> bool:
        """True: this process compiles ``digest`` holding the job-wide lease. False: a copy
        exists (fetch it), the job cannot say (compile without lease), or another process held
        the lease for ``wait`` seconds (compile here too, one warning)."""
        if self._connect() is None:
            return False
        end = time.monotonic() + wait
        attempt = 0
        try:
            while True:
                status, token = self.transport.lease(digest)
                if status in (GRANTED, TAKEN_OVER):
                    if status == TAKEN_OVER:
                        self.handovers += 1
                    self._hold(digest, token)
                    return True
                if status == HELD:
                    return False
                left = end - time.monotonic()
                if left <= 0:
                    if wait > 0:
                        log.warning(
                            "fa4cache: another %s has been compiling %s for over %.0f s; compiling here "
                            "too (raise FA4CACHE_LOCK_TIMEOUT if compiles take this long)",
                            self.transport.peer,
                            digest[:16],
                            wait,
                        )
                    return False
                self.transport.wait(digest, left, attempt)
                attempt += 1
        except Exception as e:
            self._fail(e)
            return False

    def release(self, digest: str) -> None:
        with self._lock:
            if digest not in self._held:
                return
            token = self._held.pop(digest)
        self._release_quiet(digest, token)

    def _release_quiet(self, digest: str, token: Any) -> None:
        try:
            self.transport.release(digest, token)
        except Exception as e:
            log.debug("fa4cache: releasing the lease of %s failed: %s", digest[:16], e)

    def _hold(self, digest: str, token: Any) -> None:
        with self._lock:
            self._held[digest] = token
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_loop, name="fa4cache-lease", daemon=True)
                self._renewer.start()

    def _renew_loop(self) -> None:
        # Keeps the leases of compiles in progress alive; a process that dies stops renewing,
        # and its leases pass to a waiting process at their deadline.
        while True:
            self._wake.wait(self.lease_seconds / 3)
            with self._lock:
                held = dict(self._held)
            if not held:
                continue
            try:
                renewed = self.transport.renew(held)
            except Exception as e:
                log.debug("fa4cache: lease renewal failed: %s", e)
                continue
            released = {}
            with self._lock:
                for digest, token in renewed.items():
                    if digest in self._held:
                        self._held[digest] = token
                    else:  # released meanwhile: that release ended the token it saw, not this one
                        released[digest] = token
            for digest, token in released.items():
                self._release_quiet(digest, token)

    # -- counts and compile servers --------------------------------------------------------
    def served_since_last(self) -> int:
        """Copies other processes fetched from this tier's uploads since the last call (asked
        only if it uploaded; 0 where the transport's own servers count what they serve)."""
        if not self.uploaded:
            return 0
        try:
            total = self.transport.served()
        except Exception:
            return 0
        if total is None:
            return 0
        n, self._served_seen = total - self._served_seen, total
        return max(n, 0)

    def worker_env(self) -> dict[str, str]:
        if self._connect() is None:
            return {}
        return self.transport.worker_env()


# -- which tier a store uses --------------------------------------------------------------

_NAMED: dict[str, Callable[[Path], RemoteTier]] = {}


def register_tier(name: str, factory: Callable[[Path], RemoteTier]) -> None:
    """Make ``factory(root)`` the remote tier a setting picks by ``name`` (an engine's package
    registers its own: the store names none)."""
    _NAMED[name] = factory


def named_tier(name: str) -> Callable[[Path], RemoteTier] | None:
    return _NAMED.get(name)
