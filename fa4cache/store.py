"""The persistent kernel store: content-addressed, file-locked, atomically published.

The store knows nothing about FA4: artifacts are opaque bytes (the FA4 adapter exports
and loads them). Readers take no lock: an entry is published by rename, so it is
absent or complete. What :meth:`Store.load` returns are the bytes it verified, read
from one descriptor; a loader gets a private copy of them, never the store's path
(see :mod:`fa4cache.secure_io` for the trust rules). Layout: :mod:`fa4cache.layout`;
upkeep (verify, prune, clear): :mod:`fa4cache.maintenance`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import counters as _counters
from .errors import InsecurePath
from .layout import LAYOUT, TOOLCHAIN_FILE, EntryRef, Layout
from .locks import KeyLocks, release
from .secure_io import (
    NotRegularFile,
    atomic_write,
    check_chain,
    dir_problem,
    fsync_dir,
    makedirs_private,
    only_me,
    owners,
    read_checked,
    tmp_name,
    unlink_quiet,
)
from .settings import Settings, default_dir, node_local_default
from .sidecar import MAX_ARTIFACT_BYTES, MAX_SIDECAR_BYTES, Sidecar, UseRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Artifact:
    """Verified bytes of one entry, ready to load."""

    ref: EntryRef
    data: bytes
    sidecar: Sidecar
    from_base: bool


class _Integrity(Exception):
    """An entry's own files contradict each other (checksum, size, format)."""


class Store:
    """A store directory plus optional read-only base stores.

    Example::

        store = Store()                       # FA4CACHE_DIR or ~/.cache/fa4cache
        art = store.load(ref)                 # verified bytes, or None on a miss
    """

    def __init__(self, settings: Settings | None = None, **options: Any) -> None:
        self.settings = settings if settings is not None else Settings.from_env(**options)
        self.root = self.settings.cache_dir
        self.layout = Layout(self.root)
        self.locks = KeyLocks(self.layout.locks_dir)
        self.writable = True
        self._warned: set[str] = set()
        self._trusted_dirs: set[Path] = set()
        self._touches: dict[EntryRef, float] = {}
        self._touch_lock = threading.Lock()
        self._toolchains_used: set[str] = set()
        self._open_root()
        self.counters = _counters.Counters(self.layout.stats_dir if self.writable else None)
        if self.writable:
            import atexit

            atexit.register(self.flush_touches)
        self._base_trust = owners(self.settings.trusted_uids)
        self.bases = tuple(b for b in map(self._usable_base, self.settings.base_dirs) if b is not None)

    # ------------------------------------------------------------------ opening

    def _open_root(self) -> None:
        try:
            check_chain(self.root.parent)
            makedirs_private(self.root)
            for sub in ("locks", "quarantine", "stats", LAYOUT):
                makedirs_private(self.root / sub)
        except InsecurePath as e:
            fallback = default_dir()
            if self.root != fallback and self._is_node_local_default():
                # Someone else squatted the shared node-local default: use the private one.
                log.warning("fa4cache: %s; using %s instead", e, fallback)
                self.root = fallback
                self.layout = Layout(fallback)
                self.locks = KeyLocks(self.layout.locks_dir)
                return self._open_root()
            if self.settings.insecure_policy == "refuse":
                raise
            self._warn_once("insecure-root", f"fa4cache: {e}; using an in-memory cache only")
            self.writable = False
        except OSError as e:
            # Read-only filesystem, permission denied, full disk: kernels still work,
            # they are just not persisted.
            self._warn_once(
                "unwritable", f"fa4cache: cannot use {self.root} ({e}); kernels will not be persisted"
            )
            self.writable = False

    def _is_node_local_default(self) -> bool:
        return self.root == node_local_default()

    def _usable_base(self, path: Path) -> Path | None:
        try:
            check_chain(path, trusted=self._base_trust)
            why = dir_problem(path, trusted=self._base_trust, what="base store")
        except InsecurePath as e:
            why = str(e)
        except OSError as e:
            self._warn_once(f"base:{path}", f"fa4cache: base store {path} is not usable ({e}); ignoring it")
            return None
        if why:
            hint = (
                " (if a trusted user owns it, add their uid to FA4CACHE_TRUSTED_UIDS)"
                if "owned by" in why
                else ""
            )
            if self.settings.insecure_policy == "refuse":
                raise InsecurePath(why + hint)
            self._warn_once(f"base:{path}", f"fa4cache: {why}{hint}; ignoring it")
            return None
        return path

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning(message)

    # ------------------------------------------------------------------ locks

    def acquire(self, digest: str, *, timeout: float | None = None) -> Any | None:
        """Hold the key's lock, waiting for another holder (most likely compiling this
        very kernel) up to the lock timeout. None when no lock can be had: read-only
        store, unusable lock file, or the wait timed out (the caller compiles anyway)."""
        if not self.writable:
            return None
        try:
            lk = self.locks.try_lock(digest)
            if lk is not None:
                return lk
            timeout = self.settings.lock_timeout if timeout is None else timeout
            res = self.locks.wait(digest, timeout)
        except OSError as e:
            self._warn_once(
                "lock", f"fa4cache: cannot lock key {digest[:16]} ({e}); compiling without single-flight"
            )
            return None
        self.counters.add("lock_waits")
        self.counters.add("lock_wait_seconds", res.waited)
        if res.timed_out:
            self.counters.add("lock_timeouts")
            log.warning(
                "fa4cache: another process held the lock of %s for %.0f s; not waiting longer: compiling "
                "without it (raise FA4CACHE_LOCK_TIMEOUT if compiles take this long)",
                digest[:16],
                timeout,
            )
        return res.lock

    # ------------------------------------------------------------------ read path

    def load(self, ref: EntryRef) -> Artifact | None:
        """Verified bytes of ``ref`` from the local store, else a base store; None on a miss.

        Only an integrity failure of a local entry (checksum, size, unparseable
        sidecar, not a regular file), confirmed under the key's lock, quarantines it.
        Transient trouble (no file descriptors, I/O errors, a concurrent republish)
        is a miss, and an untrusted file is refused, not moved.
        """
        roots = ([(self.root, False)] if self.writable else []) + [(b, True) for b in self.bases]
        for root, is_base in roots:
            art = self._load_from(ref, root, is_base)
            if art is not None:
                return art
        return None

    def _dirs_trusted(self, ref: EntryRef, root: Path, trusted: frozenset[int]) -> bool | None:
        """True when the entry's directories exist and are trusted, None when one is
        missing, False (counted, warned) when one is not trusted."""
        d = root
        for part in (LAYOUT, ref.toolchain, ref.kind):
            d = d / part
            if d in self._trusted_dirs:
                continue
            try:
                why = dir_problem(d, trusted=trusted, what="directory")
            except OSError:  # missing (or unreadable): a miss
                return None
            if why:
                self._refuse(ref, why)
                return False
            self._trusted_dirs.add(d)
        return True

    def _load_from(self, ref: EntryRef, root: Path, is_base: bool) -> Artifact | None:
        trusted = self._base_trust if is_base else only_me()
        if not self._dirs_trusted(ref, root, trusted):
            return None
        layout = Layout(root)
        try:
            return self._read_entry(layout, ref, trusted, is_base)
        except FileNotFoundError:
            return None
        except InsecurePath as e:
            self._refuse(ref, str(e))
        except _Integrity as e:
            if is_base:
                self._warn_once(
                    f"base-corrupt:{ref.digest}", f"fa4cache: bad entry {ref.digest[:16]} in base {root}: {e}"
                )
                return None
            return self._confirm_and_quarantine(ref, str(e))
        except OSError as e:  # EMFILE, EIO, ...: not the entry's fault
            self._warn_once(
                f"transient:{e.errno}",
                f"fa4cache: cannot read {ref.kind} entry {ref.digest[:16]} ({e}); recompiling",
            )
        return None

    def _read_entry(self, layout: Layout, ref: EntryRef, trusted: frozenset[int], is_base: bool) -> Artifact:
        try:
            side_bytes = read_checked(
                layout.sidecar_path(ref), max_bytes=MAX_SIDECAR_BYTES, trusted=trusted, what="sidecar"
            )
            sidecar = Sidecar.parse(side_bytes, ref)
            if sidecar is None:
                raise _Integrity("malformed sidecar")
            try:
                data = read_checked(
                    layout.object_path(ref), max_bytes=MAX_ARTIFACT_BYTES, trusted=trusted, what="artifact"
                )
            except FileNotFoundError:
                raise _Integrity("sidecar without artifact") from None
        except (NotRegularFile, ValueError) as e:
            raise _Integrity(str(e)) from None
        if not sidecar.matches(data):
            raise _Integrity(f"checksum mismatch ({len(data)} bytes, sidecar says {sidecar.size})")
        return Artifact(ref=ref, data=data, sidecar=sidecar, from_base=is_base)

    def _confirm_and_quarantine(self, ref: EntryRef, why: str) -> Artifact | None:
        # A publisher replaces an entry under the key lock; a reader racing it can see
        # the new sidecar with the old artifact. Re-read under the lock before judging.
        try:
            lk = self.locks.try_lock(ref.digest)
        except OSError:
            lk = None
        if lk is None:
            return None  # being republished (or unlockable): a miss, not a verdict
        try:
            try:
                return self._read_entry(self.layout, ref, only_me(), False)
            except FileNotFoundError:
                return None
            except _Integrity as e:
                self.counters.add("corrupt")
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

    def _refuse(self, ref: EntryRef, why: str) -> None:
        self.counters.add("insecure")
        self._warn_once(
            f"insecure:{ref.digest}", f"fa4cache: refusing to load {ref.kind} entry {ref.digest[:16]}: {why}"
        )

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

    # ------------------------------------------------------------------ use records

    def touch(self, art: Artifact) -> None:
        """Record a use; written in a batch by :meth:`flush_touches`, off the load path."""
        if not art.from_base and self.writable:
            with self._touch_lock:
                self._touches[art.ref] = time.time()

    def flush_touches(self) -> None:
        """Write pending uses (best effort) and refresh the toolchains' last use."""
        with self._touch_lock:
            pending, self._touches = self._touches, {}
        for ref, when in pending.items():
            self._write_use(ref, when, hit=True)
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

    def _write_use(self, ref: EntryRef, when: float, *, hit: bool) -> None:
        old = self.read_use(ref) if hit else None
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
            sidecar = Sidecar.for_data(ref, data, created=time.time(), host=socket.gethostname(), **facts)
            # The old sidecar goes first: a crash after that leaves an artifact without
            # a sidecar (a miss), never a sidecar that vouches for other bytes.
            unlink_quiet(self.layout.sidecar_path(ref))
            fd = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, 0o600)  # the exporter created it under the process umask
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(staged, self.layout.object_path(ref))
            fsync_dir(self.layout.kind_dir(ref))
            atomic_write(self.layout.sidecar_path(ref), sidecar.to_bytes())
        except (OSError, ValueError, InsecurePath) as e:
            unlink_quiet(staged)
            self._publish_failed(e)
            return False
        self._write_use(ref, time.time(), hit=False)
        if self.settings.max_size is not None:
            from .maintenance import enforce_cap

            enforce_cap(self, self.settings.max_size)
        return True

    def _publish_failed(self, e: Exception) -> None:
        self.counters.add("publish_errors")
        self._warn_once(
            "publish", f"fa4cache: cannot write to {self.root} ({e}); kernels stay in memory only"
        )
