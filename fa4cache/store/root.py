"""Opening a store's directory and its base stores: who must own what, and what happens when
someone else got there first.

* A node-local store path (one with a ``{user}``, ``{hostname}`` or ``{node_id}``
  placeholder, any path under ``FA4CACHE_NODE_LOCAL=1`` as the Ray hook sets it, or the
  node-local default) that another user squatted falls back to the private default, with
  one warning: any user can create such a path first on a fresh node. A squatted path
  named explicitly is refused (``FA4CACHE_INSECURE=warn``: memory-only).
* A squatted or untrusted base store is ignored with a warning (a missing one is ignored
  too); ``FA4CACHE_INSECURE=refuse`` makes it an error.
* Trouble that is nobody's attack (read-only filesystem, permission denied, full disk)
  means kernels still work, they are just not persisted.

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
    except OSError as e:
        warn(
            "unwritable",
            f"fa4cache: cannot use {describe_cache_dir(settings)} ({e}); kernels will not be persisted "
            f"({cache_dir_fix(settings)})",
        )
        return root, False
    return root, True


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
