"""Per-key cross-process locks: one try, one wait, both safe against hostile lock files.

A lock is held from a miss to the publish of its kernel, so N processes that miss the
same key compile it once. A lock path that is not a regular file of ours (a directory,
a link, another user's file) is never opened: the key is treated as unlockable, which
costs single-flight for that key, never a crash or a hang.

:class:`KeyLocks` are the lock files; :class:`StoreLocks` is the store's locks part
(``store.locks``), what callers take: it fails open, counts waits, and adds a job's
compile lease where the store has a remote tier.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .secure_io import my_uid

if TYPE_CHECKING:
    from .counters import Counters

log = logging.getLogger(__name__)


class UnusableLock(OSError):
    """The lock file exists but is not a regular file owned by the current user."""


@dataclass(frozen=True)
class WaitResult:
    lock: Any | None  # the held filelock.FileLock, or None
    waited: float
    timed_out: bool


# How often a waiter tries a key's lock again. The waiter is usually a first step waiting for
# a kernel another process compiles; filelock's default (0.05 s) added 25 ms to it on average.
WAIT_POLL_SECONDS = 0.005


class KeyLocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, digest: str) -> Path:
        return self.directory / f"{digest}.lock"

    def _lock(self, digest: str) -> Any:
        import filelock

        p = self.path(digest)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode) or st.st_uid != my_uid():
                raise UnusableLock(f"lock file {p} is not a regular file of yours; remove it")
        return filelock.FileLock(str(p), is_singleton=False)

    def try_lock(self, digest: str) -> Any | None:
        """The held lock, or None if another process holds it. Raises OSError if the
        lock cannot be used at all (read-only store, hostile lock file)."""
        import filelock

        lk = self._lock(digest)
        try:
            lk.acquire(timeout=0)
        except filelock.Timeout:
            return None
        return lk

    def wait(self, digest: str, timeout: float) -> WaitResult:
        """Wait up to ``timeout`` seconds for the lock. Raises OSError like :meth:`try_lock`."""
        import filelock

        lk = self._lock(digest)
        t0 = time.perf_counter()
        try:
            lk.acquire(timeout=timeout, poll_interval=WAIT_POLL_SECONDS)
        except filelock.Timeout:
            return WaitResult(None, time.perf_counter() - t0, True)
        return WaitResult(lk, time.perf_counter() - t0, False)

    @staticmethod
    def excludes(lock: Any) -> bool:
        """Whether ``lock``, held by the caller, keeps others out: a second open of its file
        must not get the lock too. On a filesystem whose flock is a no-op (some network and
        FUSE mounts) it does, and every judgement made "under the lock" is a guess."""
        import fcntl

        try:
            fd = os.open(lock.lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return True  # nothing to probe: trust the lock as before
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True  # refused while we hold it: it excludes
        else:
            return False
        finally:
            os.close(fd)  # a lock taken on this description ends with it

    def held_by_other(self, digest: str) -> bool:
        try:
            lk = self.try_lock(digest)
        except OSError:
            return False
        if lk is None:
            return True
        release(lk)
        return False


class Leases(Protocol):
    """What the locks need of a remote tier (:class:`~fa4cache.store.tiers.RemoteTier`): a
    key's job-wide compile lease."""

    def active(self) -> bool: ...

    def acquire(self, digest: str, wait: float) -> bool: ...

    def release(self, digest: str) -> None: ...


class StoreLocks:
    """The store's per-key locks, as its callers take them (``store.locks``): the node's
    lock file of a key and, where the store has a remote tier, the job-wide compile lease."""

    def __init__(
        self,
        keys: KeyLocks,
        counters: Counters,
        remote: Leases | None,
        *,
        writable: bool,
        timeout: float,
        warn: Callable[[str, str], None],
    ) -> None:
        self.keys, self._counters, self._remote = keys, counters, remote
        self._writable, self._timeout, self._warn = writable, timeout, warn

    def acquire(self, digest: str, *, timeout: float | None = None) -> Any | None:
        """Hold the key's lock, waiting for another holder (most likely compiling this
        very kernel) up to the lock timeout. None when no lock can be had: read-only
        store, unusable lock file, or the wait timed out (the caller compiles anyway)."""
        t0 = time.monotonic()
        lk = self._acquire_local(digest, timeout=timeout)
        if lk is None or self._remote is None:
            return lk
        # The node's lock is held: other processes here wait on it. Now the job-wide
        # lease (or a wait for the node that holds it), in what is left of the one wait;
        # True means this process compiles.
        wait = (self._timeout if timeout is None else timeout) - (time.monotonic() - t0)
        return _LeasedLock(lk, self._remote, digest) if self._remote.acquire(digest, max(wait, 0.0)) else lk

    def try_lock(self, digest: str) -> Any | None:
        """The key's node lock if free now, else None; OSError if it cannot be used at all."""
        return self.keys.try_lock(digest)

    def try_claim(self, digest: str) -> Any | None:
        """The key's node lock and, in a job, its job-wide lease, if both are free now
        (releasing the lock ends both); else None. Never waits: a kernel set split across
        a job's nodes claims what nobody holds and leaves the rest for later. OSError if
        the node's lock cannot be used at all (as :meth:`try_lock`)."""
        lk = self.keys.try_lock(digest)
        if lk is None or self._remote is None or not self._remote.active():
            return lk
        if self._remote.acquire(digest, 0):
            return _LeasedLock(lk, self._remote, digest)
        release(lk)
        return None

    def held_by_other(self, digest: str) -> bool:
        """Whether another process holds the key's node lock (most likely compiling it)."""
        return self.keys.held_by_other(digest)

    def _acquire_local(self, digest: str, *, timeout: float | None) -> Any | None:
        if not self._writable:
            return None
        try:
            lk = self.keys.try_lock(digest)
            if lk is not None:
                return lk
            timeout = self._timeout if timeout is None else timeout
            res = self.keys.wait(digest, timeout)
        except OSError as e:
            self._warn(
                "lock", f"fa4cache: cannot lock key {digest[:16]} ({e}); compiling without single-flight"
            )
            return None
        self._counters.add("lock_waits")
        self._counters.add("lock_wait_seconds", res.waited)
        if res.timed_out:
            self._counters.add("lock_timeouts")
            log.warning(
                "fa4cache: another process held the lock of %s for %.0f s; not waiting longer: compiling "
                "without it (raise FA4CACHE_LOCK_TIMEOUT if compiles take this long)",
                digest[:16],
                timeout,
            )
        return res.lock


class _LeasedLock:
    """A key's node lock plus its cluster lease: releasing it (:func:`release`) ends both."""

    def __init__(self, lock: Any, remote: Leases, digest: str) -> None:
        self.lock, self.remote, self.digest = lock, remote, digest

    def release(self, force: bool = False) -> None:
        try:
            self.lock.release(force=force)
        finally:
            self.remote.release(self.digest)


def release(lock: Any) -> None:
    if lock is not None:
        try:
            lock.release(force=True)
        except Exception as e:  # never let an unlock failure mask the real outcome
            log.debug("fa4cache: unlock failed: %s", e)
