"""Store tiers: where a lookup looks, in order, behind one small interface.

Like Triton's ``CacheManager``, a tier answers two questions about an entry: "do you have
verified bytes for it?" (:meth:`Tier.get`) and, for tiers that accept them, "keep these"
(:meth:`Tier.put`). The :class:`~fa4cache.store.store.Store` asks its tiers in order:

* :class:`LocalDir`: the store's own directory (ours alone; a corrupt entry is quarantined);
* :class:`ReadOnlyBase`: a base store owned by a trusted uid (never written, never repaired);
* a remote tier, named ``module:Class`` by ``FA4CACHE_REMOTE_TIER`` (the Ray cluster tier,
  :mod:`fa4cache.ray_integration.cluster`) or registered by name (the torch.distributed tier;
  :func:`fa4cache.store.remote.register_tier`): bytes it returns are re-verified and written
  to the local directory (:meth:`~fa4cache.store.store.Store.receive`) before they load. Both
  are a :class:`~fa4cache.store.remote.LeasedTier` over their engine's transport.

Every tier hands back the same :class:`Artifact`: bytes read from one descriptor and
checked against their sidecar, so what loads is what was verified. A directory tier holds
a descriptor of its root, opened by a checked walk from ``/`` (:func:`~.secure_io.open_dir`);
each lookup opens ``v2/<toolchain>/<kind>`` and then the entry's files relative to it,
one ``O_NOFOLLOW`` component at a time, checking each descriptor: the directories checked
are the directories read, whatever is renamed or linked over their paths meanwhile.

A remote tier may also coordinate compiles across machines; the store calls these when
present: ``acquire(digest, wait) -> bool`` once it holds the key's node lock (True: this
process compiles, holding a cluster lease), ``release(digest)`` with that lock, and
``announce(ref)`` after each local publish (this node now holds a copy).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fa4cache.errors import InsecurePath

from .counters import Counters
from .locks import KeyLocks, release
from .paths import LAYOUT, EntryRef, Layout
from .secure_io import (
    DIR_FLAGS,
    NotRegularFile,
    atomic_write,
    only_me,
    open_dir,
    owners,
    problem,
    read_checked,
    unlink_quiet,
)
from .sidecar import MAX_ARTIFACT_BYTES, MAX_SIDECAR_BYTES, Sidecar

log = logging.getLogger(__name__)
FRESH_SECONDS = 5.0  # without excluding locks, an entry this recent may be mid-republish


@dataclass(frozen=True)
class Artifact:
    """Verified bytes of one entry, ready to load."""

    ref: EntryRef
    data: bytes
    sidecar: Sidecar
    from_base: bool
    tier: str = "local"


class Integrity(Exception):
    """An entry's own files contradict each other (checksum, size, format)."""


class Tier(Protocol):
    """One place kernels can come from."""

    name: str

    def get(self, ref: EntryRef) -> Artifact | None:
        """Verified bytes of ``ref``, or None (a miss, an untrusted or a corrupt entry)."""
        ...


@runtime_checkable
class RemoteTier(Tier, Protocol):
    """A tier shared with other nodes of a job (the Ray cluster's, torch.distributed's).

    Named by ``FA4CACHE_REMOTE_TIER=module:Class`` (or registered by name: the store's
    ``FA4CACHE_DISTRIBUTED``) and built as ``Class(root)``, with the
    local store's directory (a node serves its copies from there). Construction must be
    cheap and must not connect: stores are built in processes that never join a job.
    Every method is best effort: a tier that cannot reach its job answers a miss (``get``),
    "compile it here" (``acquire``), or nothing, and never raises into a load or a compile.
    A tier with an ``attach(store)`` method is handed its store once built (a
    :class:`~fa4cache.store.remote.LeasedTier` reads the copies it offers through it).
    """

    last_fetch_seconds: float  # how long the last successful ``get`` took
    last_source: str  # where its bytes came from (a node, a rank): the copy's provenance

    def active(self) -> bool:
        """Whether this process is part of a job now (connected, or able to connect)."""
        ...

    def acquire(self, digest: str, wait: float) -> bool:
        """Take the job-wide compile lease of ``digest``: True means this process compiles
        it; False means another node published it meanwhile, or the lease could not be had
        within ``wait`` seconds (the caller then looks again, or compiles anyway)."""
        ...

    def release(self, digest: str) -> None:
        """End a lease taken by :meth:`acquire` (after the publish, or on failure)."""
        ...

    def announce(self, ref: EntryRef) -> None:
        """This node now holds a verified copy of ``ref`` it can serve to the others."""
        ...

    def served_since_last(self) -> int:
        """Copies other nodes fetched from this process since the last call (0 where the
        tier's own servers count what they serve)."""
        ...

    def worker_env(self) -> dict[str, str]:
        """Environment for this process's compile server, so that the kernels it compiles
        ahead are leased and shared job-wide as this process's own would be ({} if none)."""
        ...


def read_entry(
    layout: Layout,
    ref: EntryRef,
    trusted: frozenset[int],
    *,
    tier: str,
    dir_fd: int | None = None,
    require_key: bool | None = None,
) -> Artifact:
    """The entry's sidecar and artifact, each read from one descriptor and checked against
    each other and against the entry's digest (the sidecar's key text must hash to it;
    ``require_key``, by default for every tier but the local one: it must carry key text).
    Opened relative to ``dir_fd``, the kind directory, when given. Raises
    FileNotFoundError (a miss), InsecurePath, :class:`Integrity` or OSError."""
    if require_key is None:
        require_key = tier != "local"
    try:
        side_bytes = read_checked(
            layout.sidecar_path(ref),
            max_bytes=MAX_SIDECAR_BYTES,
            trusted=trusted,
            what="sidecar",
            dir_fd=dir_fd,
        )
        sidecar = Sidecar.parse(side_bytes, ref)
        if sidecar is None:
            raise Integrity("malformed sidecar")
        unbound = sidecar.key_problem(required=require_key)
        if unbound:
            raise Integrity(unbound)
        try:
            data = read_checked(
                layout.object_path(ref),
                max_bytes=MAX_ARTIFACT_BYTES,
                trusted=trusted,
                what="artifact",
                dir_fd=dir_fd,
            )
        except FileNotFoundError:
            raise Integrity("sidecar without artifact") from None
    except (NotRegularFile, ValueError) as e:
        raise Integrity(str(e)) from None
    if not sidecar.matches(data):
        raise Integrity(f"checksum mismatch ({len(data)} bytes, sidecar says {sidecar.size})")
    return Artifact(ref=ref, data=data, sidecar=sidecar, from_base=tier != "local", tier=tier)


class _DirTier:
    """What the local directory and read-only bases share: trust-checked directories."""

    name = "dir"

    def __init__(self, root: Path, trusted: frozenset[int], report: Callable[[str, str, str], None]) -> None:
        self.root = root
        self.layout = Layout(root)
        self.trusted = trusted
        self._report = report  # (tag, counter, message): the store counts and warns once
        self._root_fd: int | None = None
        try:
            # Parents: you, root and the tier's trusted owners; the root itself: the tier's owners.
            self._root_fd = open_dir(root, trusted=owners(trusted), leaf=trusted, what="store directory")
        except (OSError, InsecurePath) as e:  # checked by the store just before: only a race gets here
            report(f"root:{root}", "", f"fa4cache: cannot open {root} ({e}); not reading from it")

    def __del__(self) -> None:
        fd, self._root_fd = getattr(self, "_root_fd", None), None
        if fd is not None:
            os.close(fd)

    def _open_kind_dir(self, ref: EntryRef) -> int | None:
        """A descriptor of the entry's kind directory, each of ``v2/<toolchain>/<kind>``
        opened relative to the one above (never following a link) and checked on its
        descriptor; None on a miss or an untrusted directory (refused)."""
        if self._root_fd is None:
            return None
        d = self.root
        fd = self._root_fd
        try:
            for part in (LAYOUT, ref.toolchain, ref.kind):
                d = d / part
                try:
                    nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        self.refuse(ref, f"directory {d} is a symlink or not a directory")
                    return None  # missing (or unreadable): a miss
                if fd != self._root_fd:
                    os.close(fd)
                fd = nfd
                why = problem(os.fstat(fd), d, trusted=self.trusted, what="directory")
                if why:
                    self.refuse(ref, why)
                    return None
            opened, fd = fd, -1
            return opened
        finally:
            if fd not in (-1, self._root_fd):
                os.close(fd)

    def _read(self, ref: EntryRef) -> Artifact:
        """:func:`read_entry` through held directory descriptors. Raises FileNotFoundError
        for a miss (an untrusted directory is refused, then a miss)."""
        kind_fd = self._open_kind_dir(ref)
        if kind_fd is None:
            raise FileNotFoundError(ref.digest)
        try:
            return read_entry(self.layout, ref, self.trusted, tier=self.name, dir_fd=kind_fd)
        finally:
            os.close(kind_fd)

    def refuse(self, ref: EntryRef, why: str) -> None:
        self._report(
            f"insecure:{ref.digest}",
            "insecure",
            f"fa4cache: refusing to load {ref.kind} entry {ref.digest[:16]}: {why}",
        )

    def get(self, ref: EntryRef) -> Artifact | None:
        try:
            return self._read(ref)
        except FileNotFoundError:
            return None
        except InsecurePath as e:
            self.refuse(ref, str(e))
        except Integrity as e:
            return self.on_corrupt(ref, str(e))
        except OSError as e:  # EMFILE, EIO, ...: not the entry's fault
            self._report(
                f"transient:{e.errno}",
                "",
                f"fa4cache: cannot read {ref.kind} entry {ref.digest[:16]} ({e}); recompiling",
            )
        return None

    def on_corrupt(self, ref: EntryRef, why: str) -> Artifact | None:
        raise NotImplementedError


class ReadOnlyBase(_DirTier):
    """A base store: trusted owners only, never written or repaired."""

    def __init__(self, root: Path, trusted: frozenset[int], report: Callable[[str, str, str], None]) -> None:
        super().__init__(root, trusted, report)
        self.name = f"base:{root}"

    def on_corrupt(self, ref: EntryRef, why: str) -> Artifact | None:
        self._report(
            f"base-corrupt:{ref.digest}",
            "",
            f"fa4cache: bad entry {ref.digest[:16]} in base {self.root}: {why}",
        )
        return None


class LocalDir(_DirTier):
    """The store's own directory: a corrupt entry, confirmed under its lock, is quarantined."""

    name = "local"

    def __init__(
        self,
        root: Path,
        report: Callable[[str, str, str], None],
        locks: KeyLocks,
        counters: Counters,
    ) -> None:
        super().__init__(root, only_me(), report)
        self._locks = locks
        self._counters = counters

    def _identity(self, ref: EntryRef) -> tuple[tuple[int, int, int] | None, ...]:
        """Which files the entry is now: every publish renames new ones into place."""
        out = []
        for p in (self.layout.sidecar_path(ref), self.layout.object_path(ref)):
            try:
                st = os.lstat(p)
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def _fresh(self, ref: EntryRef) -> bool:
        """Whether a file of the entry was written in the last :data:`FRESH_SECONDS`: two
        publishes that no lock kept apart can leave one's artifact with the other's sidecar
        for a moment (the later publisher then withdraws a sidecar it finds superseded)."""
        now = time.time()
        for p in (self.layout.sidecar_path(ref), self.layout.object_path(ref)):
            try:
                if now - os.lstat(p).st_mtime < FRESH_SECONDS:
                    return True
            except OSError:
                return True
        return False

    def on_corrupt(self, ref: EntryRef, why: str) -> Artifact | None:
        # A publisher replaces an entry under the key lock; a reader racing it can see
        # the new sidecar with the old artifact. Re-read under the lock before judging,
        # and judge only an entry whose files did not change around that re-read: where
        # locks do not exclude (a filesystem whose flock is a no-op) the lock alone
        # cannot tell a republish from damage.
        before = self._identity(ref)
        try:
            lk = self._locks.try_lock(ref.digest)
        except OSError:
            lk = None
        if lk is None:
            return None  # being republished (or unlockable): a miss, not a verdict
        try:
            try:
                return self._read(ref)
            except FileNotFoundError:
                return None
            except Integrity as e:
                if self._identity(ref) != before:
                    return None  # replaced while we looked: a miss, not a verdict
                if self._fresh(ref) and not self._locks.excludes(lk):
                    return None  # written just now by a publisher our lock did not keep out
                self._counters.add("corrupt")
                log.warning(
                    "fa4cache: corrupt %s entry %s: %s; quarantined, recompiling",
                    ref.kind,
                    ref.digest[:16],
                    e,
                )
                self.quarantine(ref, str(e))
            except (InsecurePath, OSError):
                pass
            return None
        finally:
            release(lk)

    def quarantine(self, ref: EntryRef, reason: str) -> list[Path]:
        """Move an entry's files to ``quarantine/`` (atomic renames); returns the new paths."""
        moved = []
        qdir = self.layout.quarantine_dir
        stamp = time.time_ns()
        # Sidecar first: a kill in between leaves an artifact without sidecar (a miss).
        for src, ext in ((self.layout.sidecar_path(ref), "json"), (self.layout.object_path(ref), "o")):
            dst = qdir / f"{ref.digest}.{stamp}.{ext}"
            try:
                os.replace(src, dst)
                moved.append(dst)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("fa4cache: cannot quarantine %s (%s)", src, e)
        unlink_quiet(self.layout.use_path(ref))
        if moved:
            try:
                atomic_write(qdir / f"{ref.digest}.{stamp}.reason", reason.encode(), durable=False)
            except OSError:
                pass
        return moved


def verify_copy(ref: EntryRef, side: bytes, data: bytes, *, tier: str) -> Artifact | None:
    """An :class:`Artifact` of a copy from another node (a cluster peer, the job's store) if
    its sidecar parses for ``ref``, carries key text that hashes to ``ref``'s digest, and
    vouches for ``data`` (size, sha256); None for anything else. A peer's checksum only says
    that the bytes are the ones its sidecar names; the key check says they were compiled
    for this key."""
    if not isinstance(side, bytes) or not isinstance(data, bytes) or len(side) > MAX_SIDECAR_BYTES:
        return None
    sidecar = Sidecar.parse(side, ref)
    if sidecar is None or sidecar.key_problem(required=True) or not sidecar.matches(data):
        return None
    return Artifact(ref=ref, data=data, sidecar=sidecar, from_base=True, tier=tier)


def load_tier_class(spec: str) -> Callable[..., Any]:
    """``module:Class`` -> the class (Triton's way of naming a remote cache backend)."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"expected module:Class, got {spec!r}")
    return getattr(importlib.import_module(module), name)
