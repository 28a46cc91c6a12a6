"""Opening a store's directory and its base stores: who must own what, and what happens when
someone else got there first (a squatted shared path falls back to the private default)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fa4cache.errors import InsecurePath
from fa4cache.settings import Settings, default_dir, node_local_default

from .paths import LAYOUT
from .secure_io import check_chain, dir_problem, makedirs_private

log = logging.getLogger(__name__)

Warn = Callable[[str, str], None]
SUBDIRS = ("locks", "quarantine", "stats", LAYOUT)


def open_root(settings: Settings, warn: Warn) -> tuple[Path, bool]:
    """The store directory to use, created and checked, and whether it is writable.

    A squatted node-local default falls back to the private default; other trouble
    (read-only filesystem, permission denied, full disk) means kernels still work, they
    are just not persisted."""
    root = settings.cache_dir
    try:
        check_chain(root.parent)
        makedirs_private(root)
        for sub in SUBDIRS:
            makedirs_private(root / sub)
    except InsecurePath as e:
        fallback = default_dir()
        if root != fallback and root == node_local_default():
            log.warning("fa4cache: %s; using %s instead", e, fallback)
            return open_root(settings.with_cache_dir(fallback), warn)
        if settings.insecure_policy == "refuse":
            raise
        warn("insecure-root", f"fa4cache: {e}; using an in-memory cache only")
        return root, False
    except OSError as e:
        warn("unwritable", f"fa4cache: cannot use {root} ({e}); kernels will not be persisted")
        return root, False
    return root, True


def usable_base(path: Path, trusted: frozenset[int], settings: Settings, warn: Warn) -> Path | None:
    """``path`` if it is a base store a trusted uid owns, else None (warned) or InsecurePath
    (under ``FA4CACHE_INSECURE=refuse``)."""
    try:
        check_chain(path, trusted=trusted)
        why = dir_problem(path, trusted=trusted, what="base store")
    except InsecurePath as e:
        why = str(e)
    except OSError as e:
        warn(f"base:{path}", f"fa4cache: base store {path} is not usable ({e}); ignoring it")
        return None
    if why:
        hint = (
            " (if a trusted user owns it, add their uid to FA4CACHE_TRUSTED_UIDS)"
            if "owned by" in why
            else ""
        )
        if settings.insecure_policy == "refuse":
            raise InsecurePath(why + hint)
        warn(f"base:{path}", f"fa4cache: {why}{hint}; ignoring it")
        return None
    return path
