"""Opening a store's directory and its base stores: who must own what, and what happens when
someone else got there first.

* A node-local store path (one with a ``{user}``, ``{hostname}`` or ``{node_id}``
  placeholder, any path under ``FA4CACHE_NODE_LOCAL=1`` as the Ray hook sets it, or the
  node-local default) that another user squatted falls back to the private default, with
  one warning: any user can create such a path first on a fresh node. A squatted path
  named explicitly is refused (``FA4CACHE_INSECURE=warn``: memory-only).
* A squatted or untrusted base store is ignored with a warning (a missing one is ignored
  too); ``FA4CACHE_INSECURE=refuse`` makes it an error.
* Trouble that is nobody's attack (a parent that cannot be created, a read-only directory
  or filesystem, permission denied) makes the store read-only, with one warning naming the
  cause and the fix: kernels already in the directory still load, new ones stay in memory
  (a full disk is found at the first publish, with the same one warning). A path that can
  never be a directory (a file in the way) is bad input: ``install()`` raises
  (:func:`fa4cache.cache_dir.check_cache_dir`); docs/store.md says which is which.

The CLI resolves its store with :func:`resolve_root`, the same decision without creating
anything, so that every command looks at the store the workers use.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

from fa4cache.cache_dir import cache_dir_fix, cache_dir_problem, default_dir, describe_cache_dir
from fa4cache.errors import InsecurePath
from fa4cache.settings import Settings

from .paths import LAYOUT
from .secure_io import makedirs_private, only_me, open_dir

log = logging.getLogger(__name__)

Warn = Callable[[str, str], None]
SUBDIRS = ("locks", "quarantine", "stats", LAYOUT)


def _fallback(settings: Settings, e: InsecurePath, warn: Warn) -> Settings | None:
    """The settings to retry with when ``settings.cache_dir`` is unsafe: the private
    default for a node-local path, else None (after raising under the refuse policy)."""
    root, fallback = settings.cache_dir, default_dir()
    if root != fallback and settings.node_local:
        warn("squat", f"fa4cache: {e}; using {fallback} instead")
        return settings.with_cache_dir(fallback)
    if settings.insecure_policy != "warn":
        # Say which setting named the path and how to fix it: "is a symlink" alone is not enough.
        detail = cache_dir_problem(root)
        where = describe_cache_dir(settings)
        what = f"{where} {detail}" if detail else f"{e} (set by {where})"
        raise InsecurePath(f"{what}; {cache_dir_fix(settings)}") from None
    return None


def open_root(settings: Settings, warn: Warn) -> tuple[Path, bool]:
    """The store directory to use, created (each component checked before the next is
    made) and checked, and whether it is writable."""
    root = settings.cache_dir
    try:
        makedirs_private(root)
        for sub in SUBDIRS:
            makedirs_private(root / sub)
    except InsecurePath as e:
        other = _fallback(settings, e, warn)
        if other is not None:
            return open_root(other, warn)
        warn("insecure-root", f"fa4cache: {e}; using an in-memory cache only ({cache_dir_fix(settings)})")
        return root, False
    except OSError as e:  # in words where the user can fix it ("cannot be created: ... not writable by you")
        _read_only(settings, cache_dir_problem(root) or str(e), warn)
        return root, False
    why = write_problem(root)
    if why is not None:
        _read_only(settings, why, warn)
        return root, False
    return root, True


def write_problem(root: Path) -> str | None:
    """Why this process cannot write the store at ``root`` (its directory, its locks, its
    entries), or None. Asked once at open: a store that only says so at the first publish
    would be silent through every hit before it."""
    for d in (root, *(root / sub for sub in SUBDIRS)):
        if not os.access(d, os.W_OK | os.X_OK):
            try:
                if os.statvfs(d).f_flag & os.ST_RDONLY:
                    return f"{d} is on a read-only filesystem"
            except OSError:
                pass
            return f"{d} is not writable by you"
    return None


def readable_root(root: Path) -> bool:
    """Whether ``root`` is a store directory of ours that can be read (what a store it
    cannot write still serves); False for a missing or untrusted one."""
    try:
        os.close(open_dir(root, leaf=only_me(), what="cache directory"))
    except (OSError, InsecurePath):
        return False
    return True


def _read_only(settings: Settings, why: str, warn: Warn) -> None:
    """The one warning of a store this process cannot write: the cause, what still works, the fix."""
    held = (
        "the kernels already there still load, new ones stay in memory"
        if readable_root(settings.cache_dir)
        else "new ones stay in memory"
    )
    warn(
        "unwritable",
        f"fa4cache: cannot write to {describe_cache_dir(settings)} ({why}); kernels will not be persisted: "
        f"{held} ({cache_dir_fix(settings)}; a store shared read-only on purpose goes in FA4CACHE_BASE_DIRS)",
    )


def resolve_root(settings: Settings, warn: Warn) -> tuple[Path, bool]:
    """The store directory :class:`~fa4cache.store.store.Store` would use with ``settings``
    (fallback included), without creating it, and whether it exists. Raises
    :class:`InsecurePath` where the store would be refused, or memory-only
    (``FA4CACHE_INSECURE=warn``): there is no directory to look at then."""
    root = settings.cache_dir
    try:
        os.close(open_dir(root, leaf=only_me(), what="cache directory"))
    except FileNotFoundError:
        return root, False
    except InsecurePath as e:
        other = _fallback(settings, e, warn)
        if other is None:
            raise
        return resolve_root(other, warn)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise InsecurePath(f"cannot open {root}: {e}") from None
        raise
    return root, True


def usable_base(path: Path, trusted: frozenset[int], settings: Settings, warn: Warn) -> Path | None:
    """``path`` if it is a base store a trusted uid owns, else None (warned) or InsecurePath
    (under ``FA4CACHE_INSECURE=refuse``)."""
    try:
        os.close(open_dir(path, trusted=trusted, what="base store"))
    except InsecurePath as e:
        why = str(e)
    except OSError as e:
        warn(f"base:{path}", f"fa4cache: base store {path} is not usable ({e}); ignoring it")
        return None
    else:
        return path
    hint = " (if a trusted user owns it, add their uid to FA4CACHE_TRUSTED_UIDS)" if "owned by" in why else ""
    if settings.insecure_policy == "refuse":
        raise InsecurePath(why + hint)
    warn(f"base:{path}", f"fa4cache: {why}{hint}; ignoring it")
    return None
