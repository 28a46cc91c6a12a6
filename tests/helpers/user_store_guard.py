"""The test suite never writes the user's store.

The user's stores are ``FA4CACHE_DIR`` as the suite was started with, and the default
directory (``$XDG_CACHE_HOME/fa4cache`` or ``~/.cache/fa4cache``). ``tests/conftest.py``
points ``FA4CACHE_DIR`` at a store of the run's own before any test starts, so a test that
names no store writes that one; and it installs :func:`guard`, an audit hook that refuses,
with a ``PermissionError``, any write by the test process (open for writing, mkdir, rename,
remove, utime, chmod, ...) under one of the user's stores, and keeps what it refused for the
running test to fail on (:func:`take_refused`). Writes by child processes are covered by the
environment they inherit (their ``FA4CACHE_DIR``), not by the hook.

The user's stores are found once, by the first process of a run (the controller under
pytest-xdist), and travel to the workers in :data:`ENV`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

ENV = "FA4CACHE_TESTS_USER_STORES"  # os.pathsep-joined; set by the run's first process

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# audit event -> positions of (path, dir_fd) pairs it names, each a place it writes.
_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)),  # os.replace too
    "os.remove": ((0, 1),),  # os.unlink too
    "os.rmdir": ((0, 1),),
    "os.utime": ((0, 3),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.symlink": ((1, 2),),
    "os.link": ((1, 3),),
    "os.truncate": ((0, None),),
    "shutil.rmtree": ((0, 1),),
}

_roots: tuple[str, ...] = ()
_refused: list[str] = []
_installed = False


def user_stores(environ: dict[str, str] | os._Environ[str] = os.environ) -> tuple[str, ...]:
    """The user's stores for this run: from :data:`ENV` when the run's first process set it,
    else ``FA4CACHE_DIR`` (as given, unresolved placeholders left out) and the default
    directory."""
    if environ.get(ENV):
        return tuple(p for p in environ[ENV].split(os.pathsep) if p)
    from fa4cache.cache_dir import default_dir

    found = [str(default_dir())]
    given = environ.get("FA4CACHE_DIR")
    if given and "{" not in given:
        found.append(os.path.expanduser(given))
    return tuple(dict.fromkeys(found))


def guard(stores: Iterable[str]) -> None:
    """Refuse this process's writes under ``stores`` from now on (once per process; a later
    call changes the stores)."""
    global _roots, _installed
    roots: list[str] = []
    for s in stores:
        roots += [os.path.abspath(s), os.path.realpath(s)]
    _roots = tuple(dict.fromkeys(roots))
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def take_refused() -> list[str]:
    """What was refused since the last call, as ``event path`` lines; clears the list."""
    out = list(_refused)
    del _refused[:]
    return out


def _under_a_store(path: str) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in _roots)


def _where(path: Any, dir_fd: Any) -> str | None:
    if isinstance(path, int):  # an open file or directory
        return _fd_path(path)
    if not isinstance(path, (str, bytes, os.PathLike)):
        return None
    text = os.fsdecode(path)
    if not os.path.isabs(text) and isinstance(dir_fd, int):
        base = _fd_path(dir_fd)
        if base is None:
            return None
        text = os.path.join(base, text)
    return os.path.abspath(text)


def _fd_path(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _roots:
        return
    if event == "open":
        path, _mode, flags = args
        if not isinstance(flags, int) or not flags & _WRITE_FLAGS:
            return
        places: Iterable[tuple[Any, Any]] = ((path, None),)
    else:
        spots = _EVENTS.get(event)
        if spots is None:
            return
        places = ((args[i], args[d] if d is not None else None) for i, d in spots)
    for path, dir_fd in places:
        where = _where(path, dir_fd)
        if where is not None and _under_a_store(where):
            line = f"{event} {where}"
            _refused.append(line)
            raise PermissionError(f"the test suite does not write the user's store: refused {line}")
