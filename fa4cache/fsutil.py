"""Filesystem primitives: private directories, no-follow reads, atomic publishes.

Everything the store writes goes through :func:`atomic_write`: a temp file in the
destination directory, ``fsync``, ``os.replace``, then an ``fsync`` of the directory.
A reader therefore sees either the old file or the complete new one, never a torn
write, whatever kills the writer (SIGKILL, ENOSPC, power loss after the rename).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import stat
import time
from pathlib import Path

from .errors import InsecurePath

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp."
_HOST = socket.gethostname()
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def check_secure(st: os.stat_result, path: Path | str, *, trust_shared: bool, what: str) -> str | None:
    """Why ``st`` (from lstat/fstat) is unsafe to trust, or None if it is fine."""
    if stat.S_ISLNK(st.st_mode):
        return f"{what} {path} is a symlink"
    if trust_shared:
        return None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{what} {path} is owned by uid {st.st_uid}, not by the current user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def ensure_private_dir(path: Path, *, trust_shared: bool = False, create: bool = True) -> Path:
    """Create ``path`` (mode 0700) if needed and check that it is safe to use.

    Raises :class:`InsecurePath` for a symlink, a directory owned by someone else or
    one writable by group/others (unless ``trust_shared``).
    """
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except FileExistsError:
            pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise InsecurePath(f"cache directory {path} is a symlink; point the setting at the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise InsecurePath(f"cache path {path} exists and is not a directory")
    problem = check_secure(st, path, trust_shared=trust_shared, what="cache directory")
    if problem:
        raise InsecurePath(problem + " (set FA4CACHE_TRUST_SHARED=1 only for a trusted shared cache)")
    return path


def tmp_name(final: Path) -> Path:
    # Host and pid in the name let cleanup tell a dead writer's leftovers from a live one's.
    return final.with_name(f"{TMP_PREFIX}{final.name}~{_HOST}~{os.getpid()}~{secrets.token_hex(4)}")


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically; on any error nothing partial remains."""
    tmp = tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def publish_file(src: Path, dst: Path, *, durable: bool = True) -> None:
    """Atomically move an already-written file into place (fsyncing it first)."""
    fd = os.open(src, os.O_RDONLY | NOFOLLOW | CLOEXEC)
    try:
        if durable:
            os.fsync(fd)
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    os.replace(src, dst)
    if durable:
        fsync_dir(dst.parent)


def read_secure(path: Path, *, max_bytes: int, trust_shared: bool, what: str = "file") -> bytes:
    """Read a regular file without following symlinks, after ownership/size checks.

    Raises FileNotFoundError, :class:`InsecurePath`, or ValueError (too large / not a file).
    """
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InsecurePath(f"{what} {path} is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path} is not a regular file")
        problem = check_secure(st, path, trust_shared=trust_shared, what=what)
        if problem:
            raise InsecurePath(problem)
        if st.st_size > max_bytes:
            raise ValueError(f"{what} {path} is {st.st_size} bytes, over the {max_bytes} byte limit")
        chunks = []
        remaining = st.st_size + 1  # one extra byte detects a file growing under us
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise ValueError(f"{what} {path} grew past the {max_bytes} byte limit while being read")
        return data
    finally:
        os.close(fd)


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(directory: Path, *, max_age: float = 3600.0) -> int:
    """Remove temp files left by dead writers. Returns how many were removed.

    A temp file is stale when its writer (host, pid from the name) is this host and no
    longer alive, or when it is older than ``max_age`` (writers on other hosts).
    """
    removed = 0
    now = time.time()
    try:
        it = os.scandir(directory)
    except OSError:
        return 0
    with it:
        for entry in it:
            if not entry.name.startswith(TMP_PREFIX):
                continue
            parts = entry.name.rsplit("~", 3)
            stale = False
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if len(parts) == 4 and parts[1] == _HOST and parts[2].isdigit():
                stale = not pid_alive(int(parts[2])) or age > max_age
            else:
                stale = age > max_age
            if stale:
                _unlink_quiet(Path(entry.path))
                removed += 1
    return removed
