"""``fa4cache.stats()``: what the store holds and what it saved, over all processes."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from fa4cache.cache_dir import cache_dir_error, cache_dir_problem
from fa4cache.settings import Settings
from fa4cache.store import runtime
from fa4cache.store.paths import Layout

from . import counters as _counters

# Keys of the JSON schema (``fa4cache stats --json``); documented in docs/cli.md.
SCHEMA_VERSION = 2


def _entries(layout: Layout) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: {"entries": 0, "bytes": 0})
    by_tc: dict[str, dict[str, int]] = defaultdict(lambda: {"entries": 0, "bytes": 0})
    for e in layout.iter_entries():
        for d in (by_kind[e.ref.kind], by_tc[e.ref.toolchain]):
            d["entries"] += 1
            d["bytes"] += e.size
    return {"by_kind": dict(by_kind), "by_toolchain": dict(by_tc)}


def _temp_files(layout: Layout) -> tuple[int, int]:
    """How many temp files the entry directories hold, and their bytes (killed writers'
    leftovers take disk space like entries do, until the next publish or prune)."""
    n = size = 0
    for _, b in layout.iter_temp_files():
        n, size = n + 1, size + b
    return n, size


def _quarantined(layout: Layout) -> int:
    if not layout.own_dir(layout.quarantine_dir):
        return 0
    try:
        return sum(1 for n in os.listdir(layout.quarantine_dir) if n.endswith(".o"))
    except OSError:
        return 0


def _number(field: str, value: Any) -> Any:
    """Seconds as floats (ms precision), everything else counted as an int: counters
    aggregate as floats, JSON readers expect ``3``, not ``3.0``."""
    if field.endswith("_seconds"):
        return round(float(value), 3)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def collect(cache_dir: Path | str | None = None, *, current_toolchain: str | None = None) -> dict[str, Any]:
    """Totals for a store directory without creating it or importing FA4.

    ``current_toolchain`` defaults to the most recently used one recorded in the store:
    no id is recomputed here, since this process's environment may not be the job's.
    """
    settings = Settings.from_env(cache_dir)
    root = settings.cache_dir
    problem = cache_dir_problem(root, write=False)
    if problem is not None:  # a file in the way, a symlink: name the setting and the fix
        raise cache_dir_error(settings, problem)
    layout = Layout(root)
    _counters.check_stats_dir(layout.stats_dir)
    # A missing stats directory aggregates to zeros.
    agg = _counters.aggregate(layout.stats_dir)
    ent = _entries(layout)
    if current_toolchain is None:
        current_toolchain = layout.most_recent_toolchain()
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
    temp_files, temp_bytes = _temp_files(layout)
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
        "ahead_compiles": int(c["ahead_compiles"]),
        "ahead_saved_seconds": round(c["ahead_saved_seconds"], 3),
        "corrupt": int(c["corrupt"]),
        "verified_hits": int(c["verified_hits"]),
        "verify_mismatches": int(c["verify_mismatches"]),
        "quarantined": _quarantined(layout),
        "temp_files": temp_files,
        "temp_bytes": temp_bytes,
        "load_errors": int(c["load_errors"]),
        "insecure": int(c["insecure"]),
        "publish_errors": int(c["publish_errors"]),
        "lock_waits": int(c["lock_waits"]),
        "lock_wait_seconds": round(c["lock_wait_seconds"], 3),
        "lock_timeouts": int(c["lock_timeouts"]),
        "evictions": int(c["evictions"]),
        "remote_hits": int(c["remote_hits"]),
        "remote_seconds": round(c["remote_seconds"], 3),
        "served": int(c["served"]),
        "split_compiles": int(c["split_compiles"]),
        "processes": agg.get("processes", 0),
        "by_kind": {
            k: {
                **ent["by_kind"].get(k, {"entries": 0, "bytes": 0}),
                **{f: _number(f, v) for f, v in by_kind_counts.get(k, {}).items()},
            }
            for k in kinds
        },
        "by_toolchain": {
            tc: {**v, "current": tc == current_toolchain} for tc, v in sorted(ent["by_toolchain"].items())
        },
        "by_host": {
            h: {f: _number(f, x) for f, x in v["counters"].items()} for h, v in sorted(agg["by_host"].items())
        },
    }


def stats(cache_dir: Path | str | None = None) -> dict[str, Any]:
    """Totals over every process that used the store directory.

    In a process that installed fa4cache, its own counters are flushed first, so the
    numbers include this process, and "current" is its toolchain. Keys: ``entries``,
    ``bytes``, ``hits``, ``misses``, ``compiles``, ``compile_seconds`` and more (docs/cli.md).
    """
    store = runtime.installed_store()
    tc = None
    if store is not None:
        store.counters.flush()
        cache_dir = store.root if cache_dir is None else cache_dir
        t = runtime.current_toolchain()
        tc = t.id if t is not None else None
    return collect(cache_dir, current_toolchain=tc)
