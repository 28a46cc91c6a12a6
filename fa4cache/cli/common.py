"""What the ``fa4cache`` commands share: settings from the command line, the store they
inspect, sizes and ages for people, text from store files made safe for a terminal."""

from __future__ import annotations

import argparse
import time
from typing import Any

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
    return Settings.from_env(args.cache_dir)


def store_settings(args: argparse.Namespace) -> Settings:
    """The settings of the store that ``Store()`` and the Ray hook would use, fallback
    included (a squatted node-local path: the private default, with the warning), its
    directory checked from ``/`` down. Raises :class:`ConfigError` where there is none
    yet, :class:`~fa4cache.errors.InsecurePath` where it would be refused."""
    import logging

    from fa4cache.store.root import resolve_root

    s = settings_of(args)
    root, exists = resolve_root(s, lambda tag, msg: logging.getLogger("fa4cache").warning(msg))
    if not exists:
        raise ConfigError(f"cache directory {root} does not exist (nothing cached yet?)")
    return s.with_cache_dir(root)


def open_store(args: argparse.Namespace) -> Any:
    from fa4cache.store.store import Store

    return Store(store_settings(args))


def safe_text(x: Any) -> str:
    """Text from a store file, fit for a terminal (no escape sequences)."""
    return "".join(c if c.isprintable() else "?" for c in str(x))
