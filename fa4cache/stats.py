"""``fa4cache.stats()``: what the store holds and what it saved, over all processes."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from . import counters as _counters
from .settings import Settings
from .store import LAYOUT, Store

# Keys of the JSON schema (``fa4cache stats --json``); documented in the README.
SCHEMA_VERSION = 1


def _entries(root: Path) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: {"entries": 0, "bytes": 0})
    by_tc: dict[str, dict[str, int]] = defaultdict(lambda: {"entries": 0, "bytes": 0})
    base = root / LAYOUT
    try:
        tcs = os.listdir(base)
    except OSError:
        tcs = []
    for tc in tcs:
        tdir = base / tc
        try:
            kinds = [e for e in os.scandir(tdir) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for kd in kinds:
            try:
                it = os.scandir(kd.path)
            except OSError:
                continue
            with it:
                for e in it:
                    if e.name.endswith(".o") and not e.name.startswith("."):
                        try:
                            size = e.stat(follow_symlinks=False).st_size
                        except OSError:
                            continue
                        by_kind[kd.name]["entries"] += 1
                        by_kind[kd.name]["bytes"] += size
                        by_tc[tc]["entries"] += 1
                        by_tc[tc]["bytes"] += size
    return {"by_kind": dict(by_kind), "by_toolchain": dict(by_tc)}


def _quarantined(root: Path) -> int:
    try:
        return sum(1 for n in os.listdir(root / "quarantine") if n.endswith(".o"))
    except OSError:
        return 0


def collect(cache_dir: Path | str | None = None, *, current_toolchain: str | None = None) -> dict[str, Any]:
    """Totals for a store directory without creating it or importing FA4."""
    settings = Settings.from_env(cache_dir)
    root = settings.cache_dir
    # A missing stats directory aggregates to zeros.
    agg = _counters.aggregate(root / "stats")
    ent = _entries(root)
    c = agg["counters"]
    hits = c["memory_hits"] + c["disk_hits"]
    lookups = hits + c["misses"]
    by_kind_counts = agg["by_kind"]
    saved = 0.0
    for vals in by_kind_counts.values():
        if vals.get("compiles"):
            mean = vals["compile_seconds"] / vals["compiles"]
            # A memory hit saves a compile only the first time in a process; the disk hit
            # is what replaced that compile. Count disk hits.
            saved += vals.get("disk_hits", 0) * mean
    kinds = sorted(set(ent["by_kind"]) | set(by_kind_counts))
    return {
        "schema": SCHEMA_VERSION,
        "cache_dir": str(root),
        "entries": sum(v["entries"] for v in ent["by_kind"].values()),
        "bytes": sum(v["bytes"] for v in ent["by_kind"].values()),
        "hits": int(hits),
        "memory_hits": int(c["memory_hits"]),
        "disk_hits": int(c["disk_hits"]),
        "misses": int(c["misses"]),
        "hit_rate": (hits / lookups) if lookups else None,
        "compiles": int(c["compiles"]),
        "compile_seconds": round(c["compile_seconds"], 3),
        "compile_seconds_saved": round(saved, 3),
        "load_seconds": round(c["load_seconds"], 3),
        "corrupt": int(c["corrupt"]),
        "quarantined": _quarantined(root),
        "insecure": int(c["insecure"]),
        "publish_errors": int(c["publish_errors"]),
        "lock_waits": int(c["lock_waits"]),
        "lock_wait_seconds": round(c["lock_wait_seconds"], 3),
        "lock_timeouts": int(c["lock_timeouts"]),
        "evictions": int(c["evictions"]),
        "processes": agg.get("processes", 0),
        "by_kind": {
            k: {
                **ent["by_kind"].get(k, {"entries": 0, "bytes": 0}),
                **{
                    f: (round(v, 3) if isinstance(v, float) else v)
                    for f, v in by_kind_counts.get(k, {}).items()
                },
            }
            for k in kinds
        },
        "by_toolchain": {
            tc: {**v, "current": tc == current_toolchain} for tc, v in sorted(ent["by_toolchain"].items())
        },
        "by_host": {
            h: {f: (round(x, 3) if isinstance(x, float) else x) for f, x in v["counters"].items()}
            for h, v in sorted(agg["by_host"].items())
        },
    }


def stats(cache_dir: Path | str | None = None) -> dict[str, Any]:
    """Totals over every process that used the store directory.

    In a process that installed fa4cache, its own counters are flushed first, so the
    numbers include this process. Keys: ``entries``, ``bytes``, ``hits``, ``misses``,
    ``compiles``, ``compile_seconds``, ``corrupt`` and more (see the README).
    """
    from .adapters.flash_attn import current_toolchain, installed_store

    store: Store | None = installed_store()
    tc = None
    if store is not None:
        store.counters.flush()
        if cache_dir is None:
            cache_dir = store.root
        t = current_toolchain()
        tc = t.id if t is not None else None
    if tc is None:
        from .fingerprint import toolchain

        tc = toolchain().id
    return collect(cache_dir, current_toolchain=tc)
