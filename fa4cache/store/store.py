"""The persistent kernel store: content-addressed, file-locked, atomically published.

The store knows nothing about FA4: artifacts are opaque bytes (the FA4 adapter exports
and loads them). Readers take no lock: an entry is published by rename, so it is
absent or complete. What :meth:`Store.load` returns are the bytes it verified, read
from one descriptor; a loader gets a private copy of them, never the store's path
(see :mod:`fa4cache.store.secure_io` for the trust rules). Layout: :mod:`fa4cache.store.paths`;
upkeep (verify, prune, clear): :mod:`fa4cache.store.maintenance`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fa4cache.errors import InsecurePath
from fa4cache.fingerprint import load_problem
from fa4cache.settings import Settings
from fa4cache.store.paths import TOOLCHAIN_FILE, EntryInfo, EntryRef, Layout

from .counters import Counters, is_warm_process
from .locks import KeyLocks, StoreLocks
from .remote import named_tier
from .root import open_root, readable_root, usable_base
from .secure_io import (
    atomic_write,
    clean_stale_tmp,
    fsync_dir,
    makedirs_private,
    only_me,
    owners,
    read_checked,
    tmp_name,
    unlink_quiet,
)
from .sidecar import MAX_ARTIFACT_BYTES, MAX_SIDECAR_BYTES, Sidecar, UseRecord
from .tiers import Artifact, LocalDir, ReadOnlyBase, RemoteTier, Tier, load_tier_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Received:
    """What :meth:`Store.receive` did: entries published, present already, being compiled here."""

    published: tuple[EntryRef, ...]
    present: int
    busy: int
    failed: EntryRef | None = None  # could not be written: nothing of the call stays


class Store:
    """A store directory plus optional read-only base stores.

    Two named parts do the rest: ``store.counters`` (:class:`~fa4cache.store.counters.Counters`:
    ``add``, ``add_memory_hits``, ``counted``, ``counts``, ``flush``, ``fresh``) and ``store.locks``
    (:class:`~fa4cache.store.locks.StoreLocks`: ``acquire``, ``try_lock``, ``try_claim``,
    ``held_by_other``).

    Example::

        store = Store()                       # FA4CACHE_DIR or ~/.cache/fa4cache
        art = store.load(ref)                 # verified bytes, or None on a miss
        store.counters.add("disk_hits", kind=ref.kind)
    """

    def __init__(self, settings: Settings | None = None, **options: Any) -> None:
        self.settings = settings if settings is not None else Settings.from_env(**options)
        self._warned: set[str] = set()
        self._touches: dict[EntryRef, float] = {}
        self._touch_lock = threading.Lock()
        self._toolchains_used: set[str] = set()
        self._cleaned: set[Path] = set()
        self.root, self.writable = open_root(self.settings, self._warn_once)
        self.layout = Layout(self.root)
        self.remote: RemoteTier | None = None  # built below; the counters ask it what it served
        self.counters = Counters(self.layout.stats_dir if self.writable else None, served=self._served)
        keys = KeyLocks(self.layout.locks_dir)
        if self.writable:
            import atexit

            atexit.register(self.flush_touches)
        self._base_trust = owners(self.settings.trusted_uids)
        self.bases = tuple(
            b
            for b in (
                usable_base(p, self._base_trust, self.settings, self._warn_once)
                for p in self.settings.base_dirs
            )
            if b is not None
        )
        self.local = LocalDir(self.root, self._report, keys, self.counters) if self.writable else None
        # A store this process cannot write (a read-only mount, a copy shared read-only) still
        # serves what it holds, read as a base is: never written, repaired or locked.
        self._read_only_root = not self.writable and readable_root(self.root)
        self.remote = self._remote_tier()
        self.tiers: tuple[Tier, ...] = self._build_tiers()
        self.locks = StoreLocks(
            keys,
            self.counters,
            self.remote,
            writable=self.writable,
            timeout=self.settings.lock_timeout,
            warn=self._warn_once,
        )

    @classmethod
    def at(cls, cache_dir: str | os.PathLike[str], **options: Any) -> Store:
        """The store in ``cache_dir``, the other settings from the environment and ``options``."""
        return cls(Settings.from_env(cache_dir, **options))

    def _build_tiers(self) -> tuple[Tier, ...]:
        bases = [ReadOnlyBase(b, self._base_trust, self._report) for b in self.bases]
        if self._read_only_root:
            bases.insert(0, ReadOnlyBase(self.root, only_me(), self._report))
        local = [self.local] if self.local else []
        return tuple(local + bases + ([self.remote] if self.remote else []))

    def _remote_tier(self) -> RemoteTier | None:
        # FA4CACHE_REMOTE_TIER names a module:Class; FA4CACHE_DISTRIBUTED=1 picks the tier its
        # engine's package registered as "distributed" (the store names no engine).
        spec = self.settings.remote_tier or ("distributed" if self.settings.distributed else None)
        if not spec or not self.writable:  # fetched bytes load from the local directory only
            return None
        try:
            if self.settings.remote_tier:
                factory = load_tier_class(spec)
            else:
                factory = named_tier(spec)
                if factory is None:  # nothing in this process can run a job's kernels anyway
                    log.info("fa4cache: no %s tier is registered in this process; local only", spec)
                    return None
            tier = factory(self.root)
            if not isinstance(tier, RemoteTier):
                raise TypeError(f"{spec} lacks {RemoteTier.__name__}'s get/acquire/release/announce")
            attach = getattr(tier, "attach", None)
            if attach is not None:  # a LeasedTier reads the copies it offers through this store
                attach(self)
            return tier
        except Exception as e:  # an unreachable cluster is a local compile, never a failure
            self._warn_once(
                "remote", f"fa4cache: remote tier {spec} unavailable ({type(e).__name__}: {e}); local only"
            )
            return None

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning(message)

    def _served(self) -> int:
        # Kernels other nodes fetched from this one's uploads (a tier that serves through
        # the job's own store counts them there, not in a server of ours).
        return self.remote.served_since_last() if self.remote is not None else 0

    # ------------------------------------------------------------------ entries

    def entries(self, *, toolchain: str | None = None, kind: str | None = None) -> Iterator[EntryInfo]:
        """Every entry of this store's own directory (trusted directories only)."""
        return self.layout.iter_entries(toolchain=toolchain, kind=kind)

    def kinds(self) -> list[str]:
        """The kinds stored under any toolchain."""
        return sorted({k for tc in self.layout.toolchains() for k in self.layout.kinds(tc)})

    def has(self, ref: EntryRef) -> bool:
        """Whether this store's directory holds ``ref`` (its sidecar, written last, exists)."""
        return self.layout.sidecar_path(ref).exists()

    # ------------------------------------------------------------------ read path

    def load(self, ref: EntryRef, *, remote: bool = True) -> Artifact | None:
        """Verified bytes of ``ref`` from the first tier that has them; None on a miss.
        ``remote=False`` skips the remote tier (a caller that does not hold the key's lock yet:
        one process per node fetches, the others then find the local copy).

        Only an integrity failure of a local entry (checksum, size, unparseable sidecar,
        not a regular file), confirmed under the key's lock, quarantines it. Transient
        trouble (no file descriptors, I/O errors, a concurrent republish) is a miss, and
        an untrusted file is refused, not moved. Bytes from a remote tier are published
        locally (verified again) before they are returned.
        """
        for tier in self.tiers:
            if tier is self.remote and not remote:
                continue
            art = tier.get(ref)
            if art is None:
                continue
            problem = load_problem(art.sidecar.built_with)
            if problem is not None:
                # Same code generator, but its object needs what this host lacks: a miss.
                self._report(
                    f"load:{problem}", "load_refused", f"fa4cache: not loading {ref.kind} entry: {problem}"
                )
                continue
            if tier is self.remote:
                self.counters.add("remote_hits")
                self.counters.add("remote_seconds", self.remote.last_fetch_seconds)
                self.receive([art], received=self.remote.last_source or tier.name, locked=True)
            return art
        return None

    def _report(self, tag: str, counter: str, message: str) -> None:
        if counter:
            self.counters.add(counter)
        self._warn_once(tag, message)

    def quarantine(self, ref: EntryRef, reason: str) -> list[Path]:
        """Move an entry's files to ``quarantine/`` (atomic renames); returns the new paths."""
        return self.local.quarantine(ref, reason) if self.local else []

    # ------------------------------------------------------------------ use records

    def touch(self, art: Artifact) -> None:
        """Record a use; written in a batch by :meth:`flush_touches`, off the load path."""
        if not art.from_base and self.writable:
            with self._touch_lock:
                self._touches[art.ref] = time.time()

    def flush_touches(self) -> None:
        """Write pending uses (best effort) and refresh the toolchains' last use. A
        ``fa4cache warm`` process's loads are its own lookups, not a job's hits: they renew
        the entries' last use (what ``prune`` keeps) and leave their hit counts as they are,
        as :meth:`Counters.snapshot <fa4cache.store.counters.Counters.snapshot>` leaves
        ``stats``' hits: ``ls`` and ``stats`` count the same loads."""
        with self._touch_lock:
            pending, self._touches = self._touches, {}
        hit = not is_warm_process()
        for ref, when in pending.items():
            self._write_use(ref, when, hit=hit)
        for tc in list(self._toolchains_used):
            self._mark_toolchain_used(tc)

    def read_sidecar(self, ref: EntryRef) -> Sidecar | None:
        """The local entry's sidecar if it is readable, trusted and well-formed, else None."""
        try:
            data = read_checked(self.layout.sidecar_path(ref), max_bytes=MAX_SIDECAR_BYTES, trusted=only_me())
        except (OSError, ValueError, InsecurePath):
            return None
        return Sidecar.parse(data, ref)

    def read_use(self, ref: EntryRef) -> UseRecord | None:
        try:
            data = read_checked(
                self.layout.use_path(ref), max_bytes=4096, trusted=only_me(), what="use record"
            )
        except (OSError, ValueError):
            return None
        return UseRecord.parse(data)

    def _write_use(self, ref: EntryRef, when: float, *, hit: bool, fresh: bool = False) -> None:
        """Record a use of ``ref`` at ``when``, one more hit if ``hit``; ``fresh``: a new
        entry's first record (no hits)."""
        old = None if fresh else self.read_use(ref)
        rec = UseRecord(max(when, old.last_used if old else 0.0), (old.hits if old else 0) + int(hit))
        try:
            atomic_write(self.layout.use_path(ref), rec.to_bytes(), durable=False)
        except OSError:
            pass

    def record_toolchain(self, toolchain_id: str, description: dict[str, Any]) -> None:
        """Record that this process uses ``toolchain_id`` (``prune`` judges staleness by
        recorded use, never by recomputing an id in another environment)."""
        if not self.writable:
            return
        self._toolchains_used.add(toolchain_id)
        d = self.layout.toolchain_dir(toolchain_id)
        try:
            makedirs_private(d)
            if not os.path.lexists(d / TOOLCHAIN_FILE):
                atomic_write(d / TOOLCHAIN_FILE, json.dumps(description, sort_keys=True, indent=1).encode())
        except (OSError, InsecurePath) as e:
            self._warn_once("publish", f"fa4cache: cannot write to {d} ({e}); kernels will not be persisted")
            return
        self._mark_toolchain_used(toolchain_id)

    def _mark_toolchain_used(self, toolchain_id: str) -> None:
        try:
            os.utime(self.layout.toolchain_dir(toolchain_id) / TOOLCHAIN_FILE, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass

    # ------------------------------------------------------------------ write path

    def staging_path(self, ref: EntryRef) -> Path | None:
        """Where an exporter writes a new artifact (then :meth:`publish`); None if it can't."""
        if not self.writable:
            return None
        d = self.layout.kind_dir(ref)
        try:
            makedirs_private(d.parent)
            makedirs_private(d)
        except InsecurePath as e:
            self.counters.add("insecure")
            self._warn_once(f"insecure-dir:{d}", f"fa4cache: not publishing into {d}: {e}")
            return None
        except OSError as e:
            self._publish_failed(e)
            return None
        if d not in self._cleaned:
            # Once per process and directory: temp files of writers killed mid-publish
            # would otherwise stay until a prune, outside every count.
            self._cleaned.add(d)
            clean_stale_tmp(d)
        return tmp_name(self.layout.object_path(ref))

    def publish(self, ref: EntryRef, staged: Path, **facts: Any) -> bool:
        """Publish a staged artifact with its sidecar; the caller holds the key lock.

        On any failure (ENOSPC, read-only, a crash in between) nothing half-written is
        visible: the artifact appears by rename, and without its sidecar it is a miss.
        """
        try:
            data = read_checked(
                staged, max_bytes=MAX_ARTIFACT_BYTES, trusted=only_me(), what="staged artifact"
            )
            if not data:
                raise OSError(f"exporter wrote an empty file {staged}")
            facts.setdefault("origin", None)
            facts["origin"] = facts["origin"] or _origin()  # kept from the copy it came from
            sidecar = Sidecar.for_data(ref, data, created=time.time(), host=socket.gethostname(), **facts)
            side_bytes = sidecar.to_bytes()
            if len(side_bytes) > MAX_SIDECAR_BYTES:  # every reader would refuse it: a miss forever
                raise ValueError(
                    f"sidecar of {len(side_bytes)} bytes is over the {MAX_SIDECAR_BYTES} byte read limit"
                )
            # The old sidecar goes first: a crash after that leaves an artifact without
            # a sidecar (a miss), never a sidecar that vouches for other bytes.
            unlink_quiet(self.layout.sidecar_path(ref))
            fd = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, 0o600)  # the exporter created it under the process umask
                os.fsync(fd)
                ours = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            os.replace(staged, self.layout.object_path(ref))
            fsync_dir(self.layout.kind_dir(ref))
            atomic_write(self.layout.sidecar_path(ref), side_bytes)
            self._withdraw_if_superseded(ref, ours)
        except (OSError, ValueError, InsecurePath) as e:
            unlink_quiet(staged)
            self._publish_failed(e)
            return False
        self._write_use(ref, time.time(), hit=False, fresh=True)
        if self.remote is not None:
            self.remote.announce(ref)  # this node now holds a copy it can serve
        return True

    def _withdraw_if_superseded(self, ref: EntryRef, ours: int) -> None:
        """Where the key lock did not exclude (a filesystem whose flock is a no-op), another
        publisher may have renamed its artifact in after ours: our sidecar would then vouch
        for bytes it does not describe. Withdrawn, the entry is a miss, never a mismatch."""
        try:
            if os.lstat(self.layout.object_path(ref)).st_ino == ours:
                return
        except OSError:
            pass
        log.debug(
            "fa4cache: %s entry %s was republished meanwhile; withdrawing our sidecar",
            ref.kind,
            ref.digest[:16],
        )
        unlink_quiet(self.layout.sidecar_path(ref))

    def publish_bytes(self, ref: EntryRef, data: bytes, **facts: Any) -> bool:
        """Publish verified bytes that came from elsewhere (a cluster peer, a bundle)."""
        staged = self.staging_path(ref)
        if staged is None:
            return False
        try:
            atomic_write(staged, data, durable=False)
        except OSError as e:
            self._publish_failed(e)
            return False
        return self.publish(ref, staged, **facts)

    # ------------------------------------------------------------------ peers

    def serve(self, ref: EntryRef) -> Artifact | None:
        """This store's own verified copy of ``ref``, to hand to another node (a node server,
        a job-wide tier's upload, a bundle's present-check); None if it has none. A corrupt
        copy is judged by the local tier as in :meth:`load` (quarantined, confirmed under the
        key's lock), and never served."""
        return self.local.get(ref) if self.local is not None else None

    def receive(self, arts: Iterable[Artifact], *, received: str, locked: bool = False) -> Received:
        """Take verified bytes from elsewhere (a peer's copy, a bundle) into this store, one
        entry at a time, each published atomically under its key's lock with ``received``
        as its provenance. ``locked``: the caller holds the key's lock already (the load path
        holds it while it fetches); else each key's lock is tried, and an entry present here
        (verified) or being compiled here (its lock held) is skipped.

        All or nothing: if one cannot be written (the warning says why), or anything raises
        meanwhile (a bundle that changed under us, ^C), the entries this call published are
        taken back; :attr:`Received.failed` names the one that failed."""
        published: list[EntryRef] = []
        present = busy = 0
        try:
            for art in arts:
                ref = art.ref
                if not locked and self.serve(ref) is not None:
                    present += 1
                    continue
                lk = None
                if not locked:
                    try:
                        lk = self.locks.try_lock(ref.digest)
                    except OSError:  # an unusable lock file: leave that key alone
                        lk = None
                    if lk is None:
                        busy += 1  # being compiled or published here right now
                        continue
                try:
                    if not locked and self.serve(ref) is not None:
                        present += 1
                    elif self.publish_bytes(ref, art.data, received=received[:1024], **art.sidecar.facts()):
                        published.append(ref)
                    else:
                        self._withdraw(published)
                        return Received((), present, busy, failed=ref)
                finally:
                    if lk is not None:
                        lk.release(force=True)
        except BaseException:
            self._withdraw(published)
            raise
        return Received(tuple(published), present, busy)

    def _withdraw(self, refs: Iterable[EntryRef]) -> None:
        for ref in refs:  # sidecar first: a kill in between leaves a miss
            unlink_quiet(self.layout.sidecar_path(ref))
            unlink_quiet(self.layout.object_path(ref))
            unlink_quiet(self.layout.use_path(ref))

    def _publish_failed(self, e: Exception) -> None:
        self.counters.add("publish_errors")
        self._warn_once(
            "publish", f"fa4cache: cannot write to {self.root} ({e}); kernels stay in memory only"
        )


def _origin() -> dict[str, Any]:
    """Who compiled a kernel published here first, where, with which fa4cache."""
    from fa4cache.cache_dir import user_name
    from fa4cache.version import __version__

    return {
        "user": user_name()[:64],
        "uid": os.getuid() if hasattr(os, "getuid") else -1,
        "host": socket.gethostname()[:255],
        "pid": os.getpid(),
        "fa4cache": __version__,
    }
