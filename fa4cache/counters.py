"""Per-process counters, persisted crash-safely so other processes can add them up.

Each process owns one file ``stats/<host>~<pid>~<token>.json`` that only it writes,
always by atomic replace: a reader never sees a torn file, and because a process
only ever replaces its file with larger numbers, totals never go backwards, even
after SIGKILL (which loses at most the increments since the last flush).
Files of finished processes are folded into ``stats/archive.json`` by
:func:`compact`, which records the names it folded so that a crash between writing
the archive and deleting the files never counts anything twice.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .fsutil import atomic_write, ensure_private_dir, pid_alive

log = logging.getLogger(__name__)

FIELDS = (
    "memory_hits",
    "disk_hits",
    "misses",
    "compiles",
    "compile_seconds",
    "load_seconds",
    "lock_waits",
    "lock_wait_seconds",
    "lock_timeouts",
    "corrupt",
    "insecure",
    "publish_errors",
    "evictions",
)
KIND_FIELDS = ("memory_hits", "disk_hits", "compiles", "compile_seconds")
ARCHIVE = "archive.json"
ZERO = "zero.json"
_MAX_STATS_FILE = 1 << 20


class Counters:
    """Counters of one process for one store directory."""

    def __init__(self, stats_dir: Path | None) -> None:
        self.stats_dir = stats_dir
        self.values: dict[str, float] = dict.fromkeys(FIELDS, 0)
        self.by_kind: dict[str, dict[str, float]] = {}
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started = time.time()
        self._token = secrets.token_hex(4)
        self._lock = threading.Lock()
        # Throttled flushes count from process start: the first kernel loads of a new
        # process must not pay for a counter write.
        self._last_flush = time.monotonic()
        self._dirty = False
        self._failed = False
        if stats_dir is not None:
            atexit.register(self.flush)

    @property
    def path(self) -> Path | None:
        if self.stats_dir is None:
            return None
        return self.stats_dir / f"{self.host}~{self.pid}~{self._token}.json"

    def add(self, field: str, amount: float = 1, *, kind: str | None = None) -> None:
        with self._lock:
            self.values[field] += amount
            if kind is not None and field in KIND_FIELDS:
                k = self.by_kind.setdefault(kind, dict.fromkeys(KIND_FIELDS, 0))
                k[field] += amount
            self._dirty = True

    def add_memory_hits(self, kind: str, n: int) -> None:
        # Memory hits are counted lock-free on the hot path (see the adapter) and
        # folded in here only when a snapshot is taken.
        if n:
            self.add("memory_hits", n, kind=kind)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "host": self.host,
                "pid": self.pid,
                "started": self.started,
                "updated": time.time(),
                "counters": dict(self.values),
                "by_kind": {k: dict(v) for k, v in self.by_kind.items()},
            }

    def flush(self, *, throttle: float = 0.0) -> None:
        """Persist the counters; with ``throttle``, skip if flushed less than that many seconds ago."""
        if self.stats_dir is None or self._failed or (self.pid != os.getpid()):
            return
        for hook in list(_pre_flush_hooks):
            hook()
        now = time.monotonic()
        if not self._dirty or (throttle and now - self._last_flush < throttle):
            return
        path = self.path
        assert path is not None
        try:
            atomic_write(path, json.dumps(self.snapshot()).encode(), durable=False)
            self._dirty = False
            self._last_flush = now
        except OSError as e:
            # Full disk or read-only store: counting is best effort, the kernel call is not.
            self._failed = True
            log.warning("fa4cache: cannot persist counters to %s (%s); counting in memory only", path, e)


# Called before each flush so that lock-free counters elsewhere can be folded in.
_pre_flush_hooks: list[Any] = []


def _load(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_STATS_FILE + 1)
        if len(data) > _MAX_STATS_FILE:
            return None
        obj = json.loads(data)
        return obj if isinstance(obj, dict) else None
    except (OSError, ValueError):
        return None


def _iter_process_files(stats_dir: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        names = os.listdir(stats_dir)
    except OSError:
        return
    for name in names:
        if name.endswith(".json") and "~" in name and not name.startswith("."):
            obj = _load(stats_dir / name)
            if obj is not None:
                yield name, obj


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0


def _merge_into(total: dict[str, Any], obj: dict[str, Any]) -> None:
    counters = obj.get("counters") if isinstance(obj.get("counters"), dict) else {}
    for f in FIELDS:
        total["counters"][f] = total["counters"].get(f, 0) + _num(counters.get(f))
    kinds = obj.get("by_kind") if isinstance(obj.get("by_kind"), dict) else {}
    for kind, vals in kinds.items():
        if not isinstance(vals, dict):
            continue
        dst = total["by_kind"].setdefault(str(kind), dict.fromkeys(KIND_FIELDS, 0))
        for f in KIND_FIELDS:
            dst[f] = dst.get(f, 0) + _num(vals.get(f))


def _empty() -> dict[str, Any]:
    return {"counters": dict.fromkeys(FIELDS, 0), "by_kind": {}, "by_host": {}}


def aggregate(stats_dir: Path, *, apply_zero: bool = True) -> dict[str, Any]:
    """Totals over every process that used the store (archive + live files - zero point)."""
    total = _empty()
    archive = _load(stats_dir / ARCHIVE) or {}
    merged = set(archive.get("merged") or [])
    for host, obj in (archive.get("by_host") or {}).items():
        if isinstance(obj, dict):
            _merge_into(total, obj)
            _merge_into(total["by_host"].setdefault(host, _empty()), obj)
    processes = 0
    for name, obj in _iter_process_files(stats_dir):
        if name in merged:
            continue
        processes += 1
        _merge_into(total, obj)
        host = str(obj.get("host", "?"))
        _merge_into(total["by_host"].setdefault(host, _empty()), obj)
    total["processes"] = processes + int(_num(archive.get("processes")))
    if apply_zero:
        zero = _load(stats_dir / ZERO)
        if zero:
            _subtract(total, zero)
    for h in total["by_host"].values():
        h.pop("by_host", None)
    return total


def _subtract(total: dict[str, Any], zero: dict[str, Any]) -> None:
    for f in FIELDS:
        total["counters"][f] = max(0, total["counters"][f] - _num((zero.get("counters") or {}).get(f)))
    for kind, vals in (zero.get("by_kind") or {}).items():
        if kind in total["by_kind"] and isinstance(vals, dict):
            for f in KIND_FIELDS:
                total["by_kind"][kind][f] = max(0, total["by_kind"][kind][f] - _num(vals.get(f)))
    for host, obj in (zero.get("by_host") or {}).items():
        if host in total["by_host"] and isinstance(obj, dict):
            _subtract(total["by_host"][host], {**obj, "by_host": {}})


def zero(stats_dir: Path) -> None:
    """Make the current totals the new zero point (``fa4cache stats --zero``)."""
    ensure_private_dir(stats_dir)
    snap = aggregate(stats_dir, apply_zero=False)
    atomic_write(stats_dir / ZERO, json.dumps(snap).encode())


def compact(stats_dir: Path, *, older_than: float = 3600.0) -> int:
    """Fold files of finished processes into the archive; returns how many were folded.

    Only files not updated for ``older_than`` seconds, or of dead local processes, are
    folded; a live process would otherwise recreate its file and be counted twice.
    """
    import filelock

    host = socket.gethostname()
    try:
        lock = filelock.FileLock(str(stats_dir / ".compact.lock"), timeout=0)
        lock.acquire()
    except (filelock.Timeout, OSError):
        return 0
    try:
        archive = _load(stats_dir / ARCHIVE) or {"by_host": {}, "merged": [], "processes": 0}
        merged = set(archive.get("merged") or [])
        now = time.time()
        folded = []
        for name, obj in _iter_process_files(stats_dir):
            if name in merged:
                continue
            parts = name[: -len(".json")].split("~")
            dead_local = (
                len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not pid_alive(int(parts[1]))
            )
            if not dead_local and now - _num(obj.get("updated")) < older_than:
                continue
            h = str(obj.get("host", "?"))
            dst = archive.setdefault("by_host", {}).setdefault(h, {"counters": {}, "by_kind": {}})
            _merge_into(dst, obj)
            folded.append(name)
        if not folded:
            return 0
        archive["merged"] = sorted(merged | set(folded))
        archive["processes"] = int(_num(archive.get("processes"))) + len(folded)
        atomic_write(stats_dir / ARCHIVE, json.dumps(archive).encode())
        for name in folded:
            try:
                os.unlink(stats_dir / name)
            except OSError:
                pass
        # Names whose files are gone can leave the merged list: they cannot reappear
        # (a token is random per process).
        live = set(os.listdir(stats_dir))
        archive["merged"] = [n for n in archive["merged"] if n in live]
        atomic_write(stats_dir / ARCHIVE, json.dumps(archive).encode())
        return len(folded)
    finally:
        lock.release()
