"""Filesystem primitives for a store that holds native code: trust, no-follow reads, atomic writes.

A store entry is code that runs inside the training process, so the rules are strict:

* a file is opened once, without following symlinks and without blocking (a FIFO
  cannot hang a reader), checked on the open descriptor (regular file, owned by a
  trusted uid, not writable by group or others) and read from that descriptor: the
  bytes that are checked are the bytes that are used;
* directories are trusted when they and every directory above them are owned by
  root or a trusted uid and not writable by others (or sticky, like ``/tmp``);
* directories are created 0700 whatever the umask; files are written 0600 through a
  temp file, ``fsync`` and ``rename``, so a reader sees the old file or the new one,
  never a torn write, whatever kills the writer.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from fa4cache.errors import InsecurePath

TMP_PREFIX = ".tmp."
_HOST = socket.gethostname()
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class NotRegularFile(ValueError):
    """A path that should be a regular file is a FIFO, socket, device or directory."""


def my_uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def only_me() -> frozenset[int]:
    """Trust for what this user's own store holds: files and directories of this uid only."""
    return frozenset({my_uid()})


def owners(extra: Iterable[int] = ()) -> frozenset[int]:
    """The uids whose files and directories we trust: ours, root's, and ``extra``."""
    return frozenset({my_uid(), 0, *extra})


def problem(st: os.stat_result, path: Path | str, *, trusted: frozenset[int], what: str) -> str | None:
    """Why ``st`` (from lstat/fstat) must not be trusted, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"{what} {path} is a symlink"
    if st.st_uid not in trusted:
        return f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {my_uid()}) or a trusted owner"
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:
        return f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def dir_problem(path: Path, *, trusted: frozenset[int], what: str) -> str | None:
    """Why ``path`` is not a trusted real directory, or None. Raises OSError (e.g.
    FileNotFoundError) when it cannot be looked at."""
    st = os.lstat(path)
    why = problem(st, path, trusted=trusted, what=what)
    if why is None and not stat.S_ISDIR(st.st_mode):
        why = f"{what} {path} is not a directory"
    return why


def check_chain(path: Path, *, trusted: frozenset[int] | None = None) -> None:
    """Raise :class:`InsecurePath` unless every existing directory from ``/`` down to
    ``path`` (symlinks resolved, each link itself checked too) is one that only
    trusted owners can change. Without this, whoever can write a parent directory
    can swap the store for a tree of their own between two reads."""
    trusted = owners() if trusted is None else trusted
    for chain in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        d = Path(chain.anchor)
        for part in chain.parts[1:]:
            d = d / part
            try:
                st = os.lstat(d)
            except FileNotFoundError:
                break
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in trusted:
                    raise InsecurePath(f"{d} is a symlink owned by uid {st.st_uid}")
                continue  # the link's own directory was checked; its target is checked by realpath
            why = problem(st, d, trusted=trusted, what="directory")
            if why:
                raise InsecurePath(
                    f"{why}: another user could swap the cache under it. Use a directory that only "
                    f"you can change (e.g. FA4CACHE_DIR=~/.cache/fa4cache), or fix its permissions"
                )


def makedirs_private(path: Path) -> Path:
    """Create ``path`` and any missing parents 0700 (whatever the umask), then check it:
    a real directory, ours, not writable by others."""
    missing = []
    p = Path(path)
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # the umask may have removed owner bits; never adds others
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        raise InsecurePath(f"cache path {path} exists and is not a directory")
    why = problem(st, path, trusted=only_me(), what="cache directory")
    if why:
        raise InsecurePath(why)
    return path


def read_checked(path: Path, *, max_bytes: int, trusted: frozenset[int], what: str = "file") -> bytes:
    """Open once (no-follow, non-blocking), check the descriptor, read from it.

    Raises FileNotFoundError, :class:`InsecurePath` (symlink, untrusted owner, writable
    by others), :class:`NotRegularFile`, ValueError (over ``max_bytes``) or OSError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InsecurePath(f"{what} {path} is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{what} {path} is not a regular file")
        why = problem(st, path, trusted=trusted, what=what)
        if why:
            raise InsecurePath(why)
        if st.st_size > max_bytes:
            raise ValueError(f"{what} {path} is {st.st_size} bytes, over the {max_bytes} byte limit")
        chunks = []
        remaining = st.st_size + 1  # one extra byte detects a file growing under us
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 22))
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


def atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` (0600) atomically; on any error nothing partial remains."""
    tmp = tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink_quiet(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def private_copy(data: bytes, name: str) -> Path:
    """``data`` in a fresh 0700 directory of our own: what a loader that takes a path
    gets, so that it loads the verified bytes whatever happens to the store's path."""
    d = tempfile.mkdtemp(prefix="fa4cache-load-")
    p = Path(d) / name
    atomic_write(p, data, durable=False)
    return p


def remove_private_copy(path: Path) -> None:
    unlink_quiet(path)
    try:
        os.rmdir(path.parent)
    except OSError:
        pass


def unlink_quiet(path: Path) -> None:
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
    """Remove temp files left by dead writers in ``directory``; returns how many.

    A temp file is stale when its writer (host and pid from its name) is this host
    and no longer alive, or when it is older than ``max_age`` (writers elsewhere).
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
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if len(parts) == 4 and parts[1] == _HOST and parts[2].isdigit():
                stale = not pid_alive(int(parts[2])) or age > max_age
            else:
                stale = age > max_age
            if stale:
                unlink_quiet(Path(entry.path))
                removed += 1
    return removed
