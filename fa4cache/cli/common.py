"""What the ``fa4cache`` commands share: settings from the command line, the store they
inspect, sizes and ages for people, text from store files made safe for a terminal."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..cache_dir import cache_dir_error, cache_dir_problem, default_dir, describe_cache_dir
from ..errors import ConfigError
from ..settings import Settings


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``0 specs``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {nouns or (noun[:-1] + 'ies' if noun.endswith('y') else noun + 's')}"


def ago(ts: float | None) -> str:
    if not ts:
        return "-"
    d = max(0.0, time.time() - ts)
    for unit, s in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= s:
            return f"{d / s:.0f}{unit} ago"
    return f"{d:.0f}s ago"


def settings_of(args: argparse.Namespace) -> Settings:
    if args.cache_dir is None:
        return Settings.from_env()
    # A shell path: relative to where the command runs (FA4CACHE_DIR stays absolute-only,
    # since a job's workers may run elsewhere).
    raw = os.path.expanduser(args.cache_dir)
    return Settings.from_env(raw if "{" in raw else os.path.abspath(raw), cache_dir_from="--cache-dir")


class NoStoreYet(ConfigError):
    """The store directory does not exist yet: nothing was cached there."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(f"cache directory {settings.cache_dir} does not exist (nothing cached yet?)")
        self.settings = settings


def store_settings(args: argparse.Namespace) -> Settings:
    """The settings of the store that ``Store()`` and the Ray hook would use, fallback
    included (a squatted node-local path: the private default, with the warning), its
    directory checked from ``/`` down. Raises :class:`NoStoreYet` where there is none
    yet, :class:`ConfigError` naming the setting and the fix where it would be refused."""
    import logging

    from fa4cache.store.root import resolve_root

    s = settings_of(args)
    try:
        root, exists = resolve_root(s, lambda tag, msg: logging.getLogger("fa4cache").warning(msg))
    except OSError as e:  # InsecurePath too: a file in the way, a symlink, another owner
        raise cache_dir_error(s, cache_dir_problem(s.cache_dir) or str(e)) from None
    if not exists:
        raise NoStoreYet(s)
    return s.with_cache_dir(root)


class NotAStore(ConfigError):
    """A store path the user named (``--cache-dir``, ``FA4CACHE_DIR``) that holds no store:
    most often a typo. Exit 2, naming the path and the fix."""

    def __init__(self, settings: Settings, why: str) -> None:
        named = settings.cache_dir_from != "default"
        fix = "check the path; a store is made by `fa4cache warm` or by the first job that runs with fa4cache"
        if named:
            fix += f" (the default store is {default_dir()})"
        super().__init__(f"{describe_cache_dir(settings)} is not a store: the directory {why}; {fix}")
        self.settings = settings


_OTHER = "holds no store (none of v2/, stats/, locks/, quarantine/ in it)"


def _not_a_store(root: Path) -> str | None:
    """Why ``root`` is not a store, in words, or None if it is one."""
    from fa4cache.store.root import SUBDIRS

    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return "does not exist"
    if any(n in SUBDIRS and (root / n).is_dir() for n in names):
        return None
    return "is empty" if not names else _OTHER


def inspected_store_settings(args: argparse.Namespace) -> Settings:
    """:func:`store_settings` for a command that reads or removes what a store holds (stats,
    ls, verify, prune, clear, bundle export), which never creates one: the directory must be
    a store. Raises :class:`NoStoreYet` for the default directory with nothing in it yet (a
    machine where nothing was cached: there is no path to have mistyped), and
    :class:`NotAStore` for a path the user named that does not hold one (missing, empty) or
    any directory that holds something else."""
    try:
        s = store_settings(args)
    except NoStoreYet as e:
        s, why = e.settings, "does not exist"
    else:
        why = _not_a_store(s.cache_dir)
    if why is None:
        return s
    if s.cache_dir_from == "default" and why != _OTHER:
        raise NoStoreYet(s)
    raise NotAStore(s, why)


def writable_store_settings(args: argparse.Namespace) -> Settings:
    """:func:`store_settings` for a command that writes (warm, prune, clear, import): a store
    it cannot write is refused up front, not reported as done. A missing store is fine
    (created at first use) when its parent is writable."""
    try:
        s = store_settings(args)
    except NoStoreYet as e:
        s = e.settings
    problem = cache_dir_problem(s.cache_dir)  # writability included
    if problem is not None:
        raise cache_dir_error(s, problem)
    return s


def open_store(args: argparse.Namespace) -> Any:
    """The store a command looks at (:func:`inspected_store_settings`)."""
    from fa4cache.store.store import Store

    return Store(inspected_store_settings(args))


def no_store_line(e: NoStoreYet) -> str:
    """What ``stats``, ``ls``, ``verify``, ``prune`` and ``clear`` say of the default store
    not made yet: nothing wrong, nothing there (``--json``: zeros, an empty list). A path the
    user named is a :class:`NotAStore` instead."""
    return f"no store at {e.settings.cache_dir} yet: 0 entries"


def safe_text(x: Any) -> str:
    """Text from a store file, fit for a terminal (no escape sequences)."""
    return "".join(c if c.isprintable() else "?" for c in str(x))


def confirm(args: argparse.Namespace, what: str, why: str = "") -> bool:
    """Ask on the terminal before removing ``what`` (``--yes``: do not ask). Without a
    terminal to ask on, refuse (a :class:`ConfigError`, exit 2) naming ``--yes``: a script
    says so explicitly, as with ``docker system prune -f``. ``why``: what makes this run
    one to confirm (``most of the store``)."""
    if getattr(args, "yes", False):
        return True
    because = f" ({why})" if why else ""
    if not sys.stdin.isatty():
        raise ConfigError(
            f"refusing to remove {what}{because} without a terminal to confirm; "
            "pass --yes (or --dry-run to list it)"
        )
    try:
        answer = input(f"Remove {what}{because}? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")
