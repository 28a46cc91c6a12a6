"""Filesystem primitives for a store that holds native code: trust, no-follow reads, atomic writes.

A store entry is code that runs inside the training process, so the rules are strict:

* a file is opened once, without following symlinks and without blocking (a FIFO
  cannot hang a reader), checked on the open descriptor (regular file, owned by a
  trusted uid, not writable by group or others) and read from that descriptor: the
  bytes that are checked are the bytes that are used;
* directories are trusted when they and every directory above them are owned by
  root or a trusted uid and not writable by others (or sticky, like ``/tmp``);
* directories are walked from ``/`` one component at a time, each opened with
  ``O_NOFOLLOW | O_DIRECTORY`` relative to the one above and checked on its descriptor
  before the next is looked up or created (:func:`open_dir`): no check is ever of a
  different directory than the one used next;
* directories are created 0700 whatever the umask; files are written 0600 through a
  temp file, ``fsync`` and ``rename``, so a reader sees the old file or the new one,
  never a torn write, whatever kills the writer;
* a loader that wants a path gets ``/proc/self/fd/N`` of a sealed in-memory file
  (:func:`loadable_path`): there is no directory entry anyone could swap.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fa4cache.errors import InsecurePath

TMP_PREFIX = ".tmp."
_HOST = socket.gethostname()
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# A directory descriptor to walk from and open relative to. O_PATH needs no read
# permission (a parent may be 0711) and never follows the last component with O_NOFOLLOW.
DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | NOFOLLOW | CLOEXEC
_MAX_LINKS = 40  # symlinks followed in one walk, as the kernel allows


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


_MAKE_TRIES = 50  # a name that someone keeps creating and removing under us


def _make_and_open(name: str, fd: int, path: Path, what: str) -> int:
    """Create directory ``name`` 0700 in ``fd`` (unless someone else has) and open it.

    Someone else's mkdir can win and their rmdir follow before our open: that is a race
    to retry, not a directory we cannot use. Whoever keeps doing it is refused as a squatter
    (InsecurePath: a node-local store then falls back to the private default)."""
    for _ in range(_MAKE_TRIES):
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
            # The umask may have removed owner bits; never adds others. By name in
            # the directory just checked: no one else can rename our entry there.
            os.chmod(name, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        except FileNotFoundError:  # removed between our mkdir and chmod: make it again
            continue
        try:
            return os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise InsecurePath(f"{what} {path} is a symlink or not a directory") from None
    raise InsecurePath(
        f"{what} {path} keeps appearing and vanishing ({_MAKE_TRIES} tries): someone is racing us"
    )


def open_dir(
    path: Path | str,
    *,
    trusted: frozenset[int] | None = None,
    leaf: frozenset[int] | None = None,
    create: bool = False,
    what: str = "directory",
) -> int:
    """A descriptor (``O_PATH``) of directory ``path``, reached from ``/`` one component at
    a time: each opened ``O_NOFOLLOW | O_DIRECTORY`` relative to the one above and checked
    on its descriptor (owned by a ``trusted`` uid, default you and root; not writable by
    others unless sticky) before the next one is looked up. A symlink on the way is
    followed only if a trusted uid owns it, and its target is walked the same way. With
    ``create``, a missing component is made 0700 (whatever the umask) in the directory
    just checked, then opened and checked like the others: whoever creates a name first,
    the walk uses the directory it checked. ``leaf`` (default ``trusted``) are the owners
    allowed for ``path`` itself. The caller closes the descriptor.

    Raises :class:`InsecurePath`, FileNotFoundError (a missing component without
    ``create``) or OSError.
    """
    trusted = owners() if trusted is None else trusted
    leaf = trusted if leaf is None else leaf
    full = Path(os.path.abspath(path))
    todo = list(full.parts[1:])
    fd = os.open("/", DIR_FLAGS)
    here = Path("/")
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            last = not todo
            if name in ("", "."):
                continue
            try:
                nfd = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                nfd = _make_and_open(name, fd, here / name, what)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):  # a file in the way: unusable, not a link to follow
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(here / name)) from None
                if last:
                    raise InsecurePath(f"{what} {here / name} is a symlink") from None
                if st.st_uid not in trusted:
                    raise InsecurePath(f"{here / name} is a symlink owned by uid {st.st_uid}") from None
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", str(full)) from None
                target = os.readlink(name, dir_fd=fd)
                parts = list(Path(target).parts)
                if target.startswith("/"):
                    os.close(fd)
                    fd, here = -1, Path("/")
                    fd = os.open("/", DIR_FLAGS)
                    parts = parts[1:]
                todo = parts + todo
                continue
            os.close(fd)
            fd = nfd
            here = Path(os.path.normpath(here / name))
            why = problem(
                os.fstat(fd), here, trusted=leaf if last else trusted, what=what if last else "directory"
            )
            if why:
                raise InsecurePath(
                    f"{why}: another user could swap the cache under it. Use a directory that only "
                    f"you can change (e.g. FA4CACHE_DIR=~/.cache/fa4cache), or fix its permissions"
                )
        opened, fd = fd, -1
        return opened
    finally:
        if fd >= 0:
            os.close(fd)


def makedirs_private(path: Path) -> Path:
    """Create ``path`` and any missing parents 0700 (whatever the umask), each checked
    before the next is made (:func:`open_dir`); ``path`` itself must be a real directory
    of ours, not writable by others."""
    os.close(open_dir(path, leaf=only_me(), create=True, what="cache directory"))
    return path


def read_checked(
    path: Path | str,
    *,
    max_bytes: int,
    trusted: frozenset[int],
    what: str = "file",
    dir_fd: int | None = None,
) -> bytes:
    """Open once (no-follow, non-blocking), check the descriptor, read from it. With
    ``dir_fd``, the file is ``path``'s last component in that directory (the whole
    ``path`` is what messages show).

    Raises FileNotFoundError, :class:`InsecurePath` (symlink, untrusted owner, writable
    by others), :class:`NotRegularFile`, ValueError (over ``max_bytes``) or OSError.
    """
    name = path if dir_fd is None else os.path.basename(path)
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC, dir_fd=dir_fd)
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


@contextmanager
def loadable_path(data: bytes, name: str) -> Iterator[str]:
    """A path naming exactly ``data``, for a loader that takes a path, valid inside the
    ``with``: ``/proc/self/fd/N`` of a sealed ``memfd`` (no directory entry that anyone
    could swap, no file another user could open). Without ``memfd_create`` or ``/proc``,
    a file in a fresh 0700 directory made by :func:`open_dir` under the temp directory,
    whose chain is checked like the store's (a ``$TMPDIR`` that others can write, not
    sticky, is refused: :class:`InsecurePath`)."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        flags = getattr(os, "MFD_CLOEXEC", 0) | getattr(os, "MFD_ALLOW_SEALING", 0)
        fd = os.memfd_create(name, flags)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            _seal(fd)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    d = Path(tempfile.gettempdir()) / f"fa4cache-load-{os.getpid()}-{secrets.token_hex(8)}"
    os.close(open_dir(d, leaf=only_me(), create=True))
    p = d / name
    try:
        atomic_write(p, data, durable=False)
        yield str(p)
    finally:
        unlink_quiet(p)
        try:
            os.rmdir(d)
        except OSError:
            pass


def _seal(fd: int) -> None:
    # Nothing in this process can change the bytes once the loader may read them.
    import fcntl

    add = getattr(fcntl, "F_ADD_SEALS", None)
    seals = sum(getattr(fcntl, n, 0) for n in ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE"))
    if add is not None:
        try:
            fcntl.fcntl(fd, add, seals)
        except OSError:
            pass


def unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a number no pid can be, e.g.
    from a damaged file name, is not alive)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(directory: Path, *, max_age: float = 3600.0, dry_run: bool = False) -> int:
    """Remove temp files left by dead writers in ``directory``; returns how many
    (``dry_run``: only count them).

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
                if not dry_run:
                    unlink_quiet(Path(entry.path))
                removed += 1
    return removed
