"""Compile once per ``torchrun`` job: the store's remote tier on the job's c10d store.

``FA4CACHE_DISTRIBUTED=1`` (or ``fa4cache.install(distributed=True)``) makes every
:class:`~fa4cache.store.Store` of the process use :class:`DistributedTier` as its remote
tier (unless ``FA4CACHE_REMOTE_TIER`` names another). It does nothing until the default
process group exists (``torch.distributed.init_process_group``), and nothing again once it
is destroyed. While it exists:

* **Authenticated.** The job's store has no authentication: any local user or any host
  that reaches its port can write it. Every manifest carries an HMAC-SHA256 of the digest
  it is filed under and of everything in it (the sidecar names the artifact's sha256),
  under the job's key (:func:`fa4cache.store.auth.job_key`: ``FA4CACHE_JOB_SECRET``, else
  the per-user secret file in the store directory). A rank loads only what verifies.
  Without a key the tier stays off (one warning): compiles are local, nothing is read from
  the store.
* **Lookup.** A local miss asks the job: kernels published by any rank are kept in the
  job's rendezvous store (the ``TCPStore`` that ``torchrun`` and ``init_process_group``
  already run), under ``fa4cache/v2/<key id>/``: a manifest (its MAC, chunk count, who
  uploaded it, the entry's sidecar), written after the artifact's chunks (the store's
  payload limit is 8 MiB), so a manifest that exists names chunks that exist. The MAC is
  checked first, then the bytes (:func:`~fa4cache.store.tiers.verify_copy`: sha256 against
  the sidecar, the sidecar's key text against the digest asked for, its fields against the
  ref); only then does the store publish them locally, and they load from there.
* **One compile per key, job-wide.** Before a compile (the node's file lock held) a rank
  takes the key's lease, ``fa4cache/v2/<key id>/l/<digest>`` = ``<owner> <deadline>
  <MAC>``, with ``compare_set`` (atomic on the store's server). Its holder renews it every third of
  ``FA4CACHE_CLUSTER_LEASE`` while compiling and empties it after publishing. A waiter
  polls; it takes the lease over (``compare_set`` against the value it saw, so only one
  waiter wins) when the deadline passed or the holder is a dead process of this host.
* **Transport only through the store, never the process group.** A kernel miss happens
  inside the user's forward, on one rank, at a moment no other rank knows about: a
  collective there could deadlock the training code's own. The tier talks to the store's
  server over its *own* client connection (a ``TCPStore`` client to the default store's
  host and port, with timeout ``FA4CACHE_CLUSTER_TIMEOUT``), so neither its requests nor
  its timeouts touch the user's store object. A default store that is no ``TCPStore``
  (a ``FileStore``) is used through a ``PrefixStore``, never asked for a key that
  ``check`` did not find (its ``get`` would block for the group's timeout).
* **Fallback.** Any store error or timeout: one warning, a local compile, and no store
  calls for :data:`~fa4cache.store.remote.RETRY_AFTER` seconds. Nothing waits longer than
  the lock timeout.

What is said above is what :class:`C10dTransport` does; the verification of copies, the
back-off, the acquire loop, lease renewal and the counts are the leased tier's
(:mod:`fa4cache.store.remote`), shared with the Ray tier.

Trust (docs/security.md): the processes that hold the job's key. Anyone else can write the
store, but what they write never verifies: a copy is refused, a lease is taken over at once
(leases are signed too). They can delete a copy or a lease (a local or a duplicate
compile). A rank of the job that uploads wrong bytes for the right key is trusted (the
copy's sidecar says which rank and host it came from).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from fa4cache.settings import setting
from fa4cache.store.auth import JobKey, job_key
from fa4cache.store.paths import EntryRef
from fa4cache.store.remote import BUSY, GRANTED, HELD, TAKEN_OVER, Check, Copy, LeasedTier, Warn
from fa4cache.store.secure_io import pid_alive
from fa4cache.store.sidecar import MAX_ARTIFACT_BYTES, MAX_SIDECAR_BYTES, Sidecar
from fa4cache.store.tiers import Artifact

log = logging.getLogger(__name__)

PREFIX = "fa4cache/v2"  # then the key's id; PrefixStore adds the "/"
CHUNK = 4 << 20  # below the TCPStore server's 8 MiB payload limit
POLL = 0.2  # first wait between lease checks (doubles up to POLL_MAX)
POLL_MAX = 1.0
# ``host:port`` of the job's TCPStore, set by a rank for its own compile server: a process
# outside the group (no rank of its own) that compiles ahead for that rank, under the same
# leases, and uploads what it compiles. Internal plumbing between the two, not a setting.
JOB_STORE_ENV = "FA4CACHE_JOB_STORE"
MAGIC = b"FA4D2"


def _dist() -> Any | None:
    """torch.distributed, if this process imported it and the default group exists; never
    imports torch."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist if dist is not None and dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


# By digest alone: it hashes the toolchain and kind with the key text (the copy's sidecar
# must name the ref's toolchain and kind to verify).
def obj_key(digest: str) -> str:
    return f"o/{digest}"


def chunk_key(digest: str, sha256: str, i: int) -> str:
    # By content too: two ranks uploading one kernel at once never mix their chunks (a build
    # that is not bit-reproducible would otherwise leave a copy that verifies for nobody).
    return f"c/{digest}/{sha256[:16]}/{i}"


def lease_key(digest: str) -> str:
    return f"l/{digest}"


def served_key(source: str) -> str:
    return f"s/{source}"


def manifest(key: JobKey, digest: str, nchunks: int, size: int, source: str, sidecar: bytes) -> bytes:
    body = b"%d %d %s\n" % (nchunks, size, source.encode()) + sidecar
    return b"%s %s " % (MAGIC, key.sign("manifest", digest.encode(), body).encode()) + body


class Unsigned(ValueError):
    """A manifest whose MAC does not verify under this job's key: not from the job."""


def parse_manifest(value: bytes, key: JobKey, digest: str) -> tuple[int, int, str, bytes] | None:
    """(chunks, size, source, sidecar) of an authentic manifest for ``digest``; None for one
    that is malformed. Raises :class:`Unsigned` when the MAC does not verify (checked before
    anything in it is believed)."""
    magic, _, rest = value.partition(b" ")
    mac, _, body = rest.partition(b" ")
    if magic != MAGIC or len(value) > MAX_SIDECAR_BYTES + 256:
        raise Unsigned("not a manifest of this format")
    try:
        ok = key.verify(mac.decode("ascii"), "manifest", digest.encode(), body)
    except UnicodeDecodeError:
        ok = False
    if not ok:
        raise Unsigned("its MAC does not verify under this job's key")
    head, sep, side = body.partition(b"\n")
    parts = head.split(b" ", 2)
    if not sep or len(parts) != 3:
        return None
    try:
        n, size = int(parts[0]), int(parts[1])
        source = parts[2].decode()
    except (ValueError, UnicodeDecodeError):
        return None
    if not (0 < n <= MAX_ARTIFACT_BYTES // CHUNK + 1 and 0 < size <= MAX_ARTIFACT_BYTES):
        return None
    return n, size, source, side


def _process_namespace() -> str:
    """Which pids this process can see: the boot and the pid namespace. Two containers that
    share a hostname (host networking) but not a pid namespace must not judge each other's
    pids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return "?"
    return f"{boot}-{ns}"


def _bounded(fn: Callable[[], Any], timeout: float) -> Any:
    """``fn()`` on a thread of its own, waited for ``timeout`` seconds at most. A TCPStore
    client's timeout bounds connecting and waiting for a key, not a server that stops
    answering (a hung host, a partition): without this a rank would block in its forward."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="fa4cache-dist-call", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class DistributedTier(LeasedTier):
    """The store's remote tier on torch.distributed (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, C10dTransport)

    @property
    def prefix(self) -> str:
        """``fa4cache/v2/<key id>``: where this job's kernels are kept in its store, once connected."""
        return cast(C10dTransport, self.transport).prefix


class C10dTransport:
    """Copies and leases through the job's c10d store (see the module docstring)."""

    name = "distributed"
    peer = "rank"
    unreachable = "fa4cache: the job's c10d store is unreachable ({error}); compiling locally (shown once)"
    bad_copy = (
        "fa4cache: the job's copy of {kind} entry {digest} (from {source}) does not match its key or "
        "checksum; not loading it"
    )

    def __init__(self, root: Path, warn: Warn) -> None:
        # Cheap and torch-free: stores are built in processes that never join a job.
        self.root = Path(root)
        self._warn = warn
        self.lease_seconds = float(setting("FA4CACHE_CLUSTER_LEASE"))
        self.timeout = float(setting("FA4CACHE_CLUSTER_TIMEOUT"))
        self.host = socket.gethostname()
        self.namespace = _process_namespace()
        self.owner = f"{self.host}:{os.getpid()}:{self.namespace}:{secrets.token_hex(4)}"
        self._store: Any = None
        self._joined = False  # saw a process group (so its end is news)
        self._address: str | None = None  # host:port of the job's TCPStore, once connected
        self._key: JobKey | None = None
        self._ids: Any = None  # fa4cache/v2 itself: which key ids the job's ranks use
        self._no_key = ""  # why there is no key (then the tier stays off)
        self.prefix = ""  # fa4cache/v2/<key id>, once connected
        self._refused: dict[str, bytes] = {}  # digest -> a manifest refused here (replaced on upload)
        # digest -> (lease value, when this process first saw it): a lease is stale when its
        # value has not changed for a lease time by this process's own clock (its holder
        # renews it, changing the value, every third of that), whatever the hosts' clocks say.
        self._seen: dict[str, tuple[str, float]] = {}

    # -- connection -------------------------------------------------------------------
    @property
    def source(self) -> str:
        """This rank and its node's store: who uploaded a copy (provenance, served counts)."""
        rank = os.environ.get("RANK", "?")
        return f"rank{rank}@{self.host}:{os.getpid()}"

    def connect(self) -> Any | None:
        dist = _dist()
        address = os.environ.get(JOB_STORE_ENV) if dist is None else None
        if dist is None and not address:
            if self._joined:
                self._joined = False
                self._store = None
                self._warn("gone", "fa4cache: the process group is gone; compiling locally (shown once)")
            return None
        self._joined = dist is not None
        if self._key is None and not self._no_key:
            key, why = job_key(self.root)
            self._key, self._no_key = key, ("" if key is not None else why)
            if key is not None:
                self.prefix = f"{PREFIX}/{key.id}"
                log.info(
                    "fa4cache: the torch.distributed tier authenticates with the secret of %s", key.source
                )
        if self._key is None:
            self._warn(
                "nokey",
                f"fa4cache: no job secret for the torch.distributed tier ({self._no_key}); compiling locally "
                "and reading nothing from the job's store (shown once)",
            )
            return None
        if self._store is None:
            self._store = self._open(dist) if dist is not None else self._open_address(address or "")
            self._note_key()
        return self._store

    def disconnect(self) -> None:
        self._store = None

    def _note_key(self) -> None:
        """Say once when the job's ranks hold different secrets: each shares only with ranks
        of its own (a multi-node job without FA4CACHE_JOB_SECRET, stores not shared). Only
        a hint: anyone can append to this list, and nothing trusts it."""
        ids_store, key = self._ids, self._key
        if ids_store is None or key is None:
            return
        try:
            self._call(lambda: ids_store.append("ids", f"{key.id} "))
            ids = set(_text(self._call(lambda: ids_store.get("ids"))).split())
        except Exception as e:
            log.debug("fa4cache: could not compare job keys: %s", e)
            return
        if len(ids) > 1:
            self._warn(
                "keys",
                f"fa4cache: ranks of this job authenticate with {len(ids)} different secrets (this one: "
                f"{key.source}); each shares kernels only with ranks of the same secret. Set one "
                "FA4CACHE_JOB_SECRET for the whole job (docs/security.md) (shown once)",
            )

    def _client(self, host: str, port: int) -> Any:
        import datetime

        import torch.distributed as dist

        # Our own connection to the job's store server: our timeouts, our socket.
        client = dist.TCPStore(
            host,
            port,
            is_master=False,
            timeout=datetime.timedelta(seconds=self.timeout),
            wait_for_workers=False,
        )
        self._address = f"{host}:{port}"
        self._ids = dist.PrefixStore(PREFIX, client)
        return dist.PrefixStore(self.prefix, client)

    def _open(self, dist: Any) -> Any:
        from torch.distributed.distributed_c10d import _get_default_store

        default = _get_default_store()
        under = default
        while hasattr(under, "underlying_store"):
            under = under.underlying_store
        if isinstance(under, dist.TCPStore):
            return self._client(under.host, under.port)
        self._ids = dist.PrefixStore(PREFIX, default)
        return dist.PrefixStore(self.prefix, default)

    def _open_address(self, address: str) -> Any:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{JOB_STORE_ENV}={address!r} is not host:port")
        return self._client(host, int(port))

    def worker_env(self) -> dict[str, str]:
        """For this rank's compile server: the tier and the job's store address, so that
        what it compiles ahead is leased and uploaded like this rank's own compiles. Empty
        where the job's store is no TCPStore (nothing to connect to)."""
        if self._address is None:
            return {}
        return {
            "FA4CACHE_REMOTE_TIER": f"{__name__}:{DistributedTier.__name__}",
            JOB_STORE_ENV: self._address,
        }

    # -- copies -------------------------------------------------------------------------------
    def fetch(self, ref: EntryRef, check: Check) -> Artifact | None:
        st, key = self._store, self._key
        if st is None or key is None:
            return None
        name = obj_key(ref.digest)
        if not self._call(lambda: st.check([name])):
            return None
        value = self._call(lambda: st.get(name))
        try:
            got = parse_manifest(value, key, ref.digest)
        except Unsigned as e:
            self._refused[ref.digest] = value
            return check(
                Copy(
                    "?",
                    b"",
                    b"",
                    refused=f"fa4cache: the copy of {ref.kind} entry {ref.digest[:16]} in the job's store is not "
                    f"signed by this job ({e}: someone outside the job wrote it, or a rank with another "
                    "FA4CACHE_JOB_SECRET); not loading it, compiling here",
                )
            )
        side_ok = Sidecar.parse(got[3], ref) if got is not None else None
        if got is None or side_ok is None:
            copy = Copy(got[2] if got is not None else "?", b"", b"")  # malformed: fails the check
        else:
            n, size, source, side = got
            keys = [chunk_key(ref.digest, side_ok.sha256, i) for i in range(n)]
            data = b"".join(self._call(lambda: st.multi_get(keys)))
            # Shorter or longer than its signed manifest says: damaged (fails the check).
            copy = Copy(source, side, data) if len(data) == size else Copy(source, b"", b"")
        art = check(Copy(f"torch.distributed {copy.source}", copy.sidecar, copy.data))
        if art is None:
            self._refused[ref.digest] = value
            return None
        self._call_quiet(lambda: st.add(served_key(copy.source), 1))
        return art

    def offer(self, ref: EntryRef, copy: Callable[[], Artifact | None]) -> bool:
        """Upload this node's copy of ``ref`` to the job's store unless a copy is there."""
        st, key = self._store, self._key
        if st is None or key is None:
            return False
        refused = self._refused.pop(ref.digest, None)
        if refused is None and self._call(lambda: st.check([obj_key(ref.digest)])):
            return False
        art = copy()
        if art is None or art.sidecar.key is None:  # no key text: nothing binds the copy
            return False
        data, sha = art.data, art.sidecar.sha256
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        for i, c in enumerate(chunks):
            self._call(lambda i=i, c=c: st.set(chunk_key(ref.digest, sha, i), c))
        value = manifest(key, ref.digest, len(chunks), len(data), self.served_as, art.sidecar.to_bytes())
        # The first manifest stays: a second uploader's chunks sit under their own names.
        # One this rank refused (not the job's, or damaged) is replaced, if still there.
        self._call(lambda: st.compare_set(obj_key(ref.digest), refused or "", value))
        return True

    @property
    def served_as(self) -> str:
        """The name this transport's uploads are counted under: one per tier object (several
        stores in one process each fold their own count)."""
        return f"{self.source}:{self.owner.rpartition(':')[2]}"

    def served(self) -> int | None:
        """Over a connection it already has (never a new one at exit, when the job's store
        may be gone)."""
        st = self._store
        if st is None:
            return None
        return int(self._call(lambda: st.add(served_key(self.served_as), 0)))

    # -- leases -------------------------------------------------------------------------------
    def lease(self, digest: str) -> tuple[str, Any]:
        st = self._store
        if self._published(st, digest):
            return HELD, None
        mine = self._lease_value(digest)
        cur = _text(self._call(lambda: st.compare_set(lease_key(digest), "", mine)))
        if cur == mine:
            self._seen.pop(digest, None)
            return GRANTED, mine
        # Only one waiter's compare_set sees the value it read: that one takes over.
        if (
            self._expired(digest, cur)
            and _text(self._call(lambda: st.compare_set(lease_key(digest), cur, mine))) == mine
        ):
            log.info("fa4cache: took over the compile lease of %s from %r", digest[:16], cur[:120])
            self._seen.pop(digest, None)
            return TAKEN_OVER, mine
        return BUSY, None

    def wait(self, digest: str, seconds: float, attempt: int) -> None:
        time.sleep(min(POLL * 2**attempt, POLL_MAX, seconds))

    def renew(self, held: dict[str, Any]) -> dict[str, Any]:
        st = self._store
        if st is None:
            return {}
        renewed = {}
        for digest, old in held.items():
            new = self._lease_value(digest)
            try:
                if (
                    _text(self._call(lambda d=digest, o=old, n=new: st.compare_set(lease_key(d), o, n)))
                    == new
                ):
                    renewed[digest] = new
            except Exception as e:
                log.debug("fa4cache: lease renewal failed: %s", e)
        return renewed

    def release(self, digest: str, token: Any) -> None:
        st = self._store
        if st is not None:
            self._call_quiet(lambda: st.compare_set(lease_key(digest), token, ""))
            self._seen.pop(digest, None)

    # -- helpers ---------------------------------------------------------------------------
    def _published(self, st: Any, digest: str) -> bool:
        """A manifest is there, and not the one this rank refused (then compile: under the
        lease, and the upload replaces it)."""
        if not self._call(lambda: st.check([obj_key(digest)])):
            return False
        refused = self._refused.get(digest)
        return refused is None or self._call(lambda: st.get(obj_key(digest))) != refused

    def _expired(self, digest: str, cur: str) -> bool:
        if not cur:
            return False  # released just now: the next compare_set takes it
        now = time.monotonic()
        seen = self._seen.get(digest)
        if seen is None or seen[0] != cur:
            self._seen[digest] = seen = (cur, now)
        if now - seen[1] > self.lease_seconds:
            return True  # not renewed for a lease time (or not a lease at all: damage)
        body, _, mac = cur.rpartition(" ")
        key = self._key
        if key is None or not key.verify(mac, "lease", digest.encode(), body.encode()):
            return True  # not a lease of the job's (anyone can write the store): no wait for it
        # A dead holder that this process can see: at once (same host, same pid namespace).
        owner = body.rpartition(" ")[0]
        host, pid, namespace = (owner.split(":") + ["", "", ""])[:3]
        return host == self.host and namespace == self.namespace and pid.isdigit() and not pid_alive(int(pid))

    def _lease_value(self, digest: str) -> str:
        """``<owner> <deadline> <MAC>``: a lease only a process holding the job key can write,
        so one that anybody else wrote is taken over at once instead of waited on."""
        body = f"{self.owner} {time.time() + self.lease_seconds:.3f}"
        assert self._key is not None  # the tier is off without a key
        return f"{body} {self._key.sign('lease', digest.encode(), body.encode())}"

    def _call(self, fn: Callable[[], Any]) -> Any:
        """A store call bounded by ``FA4CACHE_CLUSTER_TIMEOUT``; a timeout drops the
        connection like any failure (the tier backs off)."""
        return _bounded(fn, self.timeout)

    def _call_quiet(self, fn: Any) -> None:
        try:
            self._call(fn)
        except Exception as e:
            log.debug("fa4cache: c10d store call failed: %s", e)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def single_flight_mode(
    remote_tier: str | None, distributed: bool, shared_fs: bool, locks_work: bool | None
) -> tuple[str, str]:
    """``doctor``'s line on how one compile per key is kept: (status, words)."""
    tier = remote_tier or ("torch.distributed" if distributed else None)
    if tier and "ray_integration" in tier:
        tier = "Ray cluster"
    if shared_fs or locks_work is False:
        where = "shared filesystem" if shared_fs else "filesystem whose flock does not exclude"
        if tier:
            return "ok", (
                f"{where}: publishes stay correct without flock (rename, then a superseded sidecar is "
                f"withdrawn); single-flight by the {tier} tier's job-wide leases"
                + (" once the process group exists" if tier == "torch.distributed" else "")
            )
        return "warn", (
            f"{where}: publishes stay correct without flock, but two processes may compile one kernel; "
            "under torchrun set FA4CACHE_DISTRIBUTED=1 (job-wide leases), or use a node-local FA4CACHE_DIR"
        )
    if tier:
        return "ok", f"node file locks, then the {tier} tier's job-wide leases" + (
            " (once the default process group exists)" if tier == "torch.distributed" else ""
        )
    return "ok", "node file locks (each node compiles its own copy; FA4CACHE_DISTRIBUTED=1 under torchrun)"
