"""Per-key cross-process locks: one try, one wait, both safe against hostile lock files.

A lock is held from a miss to the publish of its kernel, so N processes that miss the
same key compile it once. A lock path that is not a regular file of ours (a directory,
a link, another user's file) is never opened: the key is treated as unlockable, which
costs single-flight for that key, never a crash or a hang.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .secure_io import my_uid

log = logging.getLogger(__name__)


class UnusableLock(OSError):
    """The lock file exists but is not a regular file owned by the current user."""


@dataclass(frozen=True)
class WaitResult:
    lock: Any | None  # the held filelock.FileLock, or None
    waited: float
    timed_out: bool


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
            lk.acquire(timeout=timeout)
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


def release(lock: Any) -> None:
    if lock is not None:
        try:
            lock.release(force=True)
        except Exception as e:  # never let an unlock failure mask the real outcome
            log.debug("fa4cache: unlock failed: %s", e)
