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
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fa4cache.errors import InsecurePath

from .secure_io import atomic_write, dir_problem, makedirs_private, only_me, pid_alive, read_checked

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
    "load_errors",
    "load_refused",  # entries of this code generator whose objects need what this host lacks (tvm-ffi ABI)
    # Cluster tier (fa4cache.ray_integration.cluster): kernels fetched from another node,
    # the seconds those fetches took, and kernels this node's server sent to others.
    "remote_hits",
    "remote_seconds",
    "served",
    # torch.distributed (fa4cache.adapters.distributed): kernels compiled as this node's
    # share of a kernel set split across the job's nodes (fetched ones count as remote_hits).
    "split_compiles",
    "ahead_compiles",  # compiled by a background worker before a step asked (compile-ahead)
    "ahead_saved_seconds",  # compile seconds those kernels kept off a step's critical path
    "memory_only_compiles",  # kernels of code no key describes completely: never stored (fa4cache.identity)
    "fail_open",  # calls where something inside fa4cache failed and FA4 ran as without it (adapters/fa4/fail_open.py)
    # FA4CACHE_VERIFY_HITS: stored hits compiled again and compared, and those that differed
    # (quarantined): adapters/compile/verify_hits.py.
    "verified_hits",
    "verify_mismatches",
)
KIND_FIELDS = ("memory_hits", "disk_hits", "compiles", "compile_seconds")
# A job's lookups: what `stats` reports as hits, misses, hit rate and lock waits.
LOOKUP_FIELDS = ("memory_hits", "disk_hits", "misses", "lock_waits", "lock_wait_seconds")
ARCHIVE = "archive.json"
ZERO = "zero.json"
_MAX_STATS_FILE = 1 << 20
_MAX_COUNT = 1e15  # larger values are damage, not counts
# A dot separates a namespace (quack.rmsnorm_fwd, jit.<function>); never first, so never "." or "..".
_KIND = re.compile(r"[a-z0-9][a-z0-9_.]{0,63}")


class Counters:
    """Counters of one process for one store directory: the store's counters part
    (``store.counters``). ``served`` answers how many copies other nodes fetched from this
    process since it was last asked (a remote tier's count): every unthrottled flush adds it."""

    def __init__(self, stats_dir: Path | None, served: Callable[[], int] | None = None) -> None:
        self.stats_dir = stats_dir
        self._served = served
        self._start()
        if stats_dir is not None:
            atexit.register(self.flush)

    def _start(self) -> None:
        self.values: dict[str, float] = dict.fromkeys(FIELDS, 0)
        self.by_kind: dict[str, dict[str, float]] = {}
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started = time.time()
        self._token = secrets.token_hex(4)
        self._lock = threading.Lock()
        # One flush at a time: two threads' snapshots written in the other order would
        # leave the older one on disk (seen with a Ray actor serving fetches on 4 threads).
        self._flush_lock = threading.Lock()
        # Throttled flushes count from process start: the first kernel loads of a new
        # process must not pay for a counter write.
        self._last_flush = time.monotonic()
        self._dirty = False
        self._failed = False

    def fresh(self) -> None:
        """Start counting anew in this process (a forked worker: its parent counts its own),
        into a file of its own; the store's tiers and locks count here too."""
        self._start()

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

    def counted(self, field: str) -> float:
        """This process's count of ``field`` so far."""
        return self.values.get(field, 0.0)

    def counts(self) -> dict[str, float]:
        """A copy of this process's counters."""
        return dict(self.values)

    def snapshot(self) -> dict[str, Any]:
        """What :meth:`flush` persists. In a ``fa4cache warm`` process (:func:`mark_warm_process`)
        the lookups are warm's own (a kernel looked up again after its compile, a worker
        waiting for another worker's kernel, the check that a kernel is present): they are
        kept in memory (warm's table reports them) and persisted as zeros, so that
        ``stats``' hits, misses and lock waits are the jobs'. Compiles count as ever."""
        with self._lock:
            values = dict(self.values)
            by_kind = {k: dict(v) for k, v in self.by_kind.items()}
        if _NOT_A_JOB:
            for f in LOOKUP_FIELDS:
                values[f] = 0.0
            for v in by_kind.values():
                for f in LOOKUP_FIELDS:
                    if f in v:
                        v[f] = 0
        return {
            "host": self.host,
            "pid": self.pid,
            "started": self.started,
            "updated": time.time(),
            "counters": values,
            "by_kind": by_kind,
        }

    def flush(self, *, throttle: float = 0.0) -> None:
        """Persist the counters; with ``throttle``, skip if flushed less than that many seconds
        ago. An unthrottled flush first adds what the remote tier served (``served``)."""
        if not throttle and self._served is not None:
            n = self._served()
            if n:
                self.add("served", n)
        if self.stats_dir is None or self._failed or (self.pid != os.getpid()):
            return
        for hook in tuple(_before_flush):
            hook()
        with self._flush_lock:
            now = time.monotonic()
            if not self._dirty or (throttle and now - self._last_flush < throttle):
                return
            path = self.path
            assert path is not None
            with self._lock:
                self._dirty = False  # an add from here on marks it again, for the next flush
            snap = self.snapshot()
            try:
                atomic_write(path, json.dumps(snap).encode(), durable=False)
                self._last_flush = now
            except OSError as e:
                self._dirty = True
                self._fail(path, e)

    def _fail(self, path: Path, e: OSError) -> None:
        # Full disk or read-only store: counting is best effort, the kernel call is not.
        self._failed = True
        log.warning("fa4cache: cannot persist counters to %s (%s); counting in memory only", path, e)


_NOT_A_JOB = False


def mark_warm_process() -> None:
    """This process, and the workers forked from it, run ``fa4cache warm``: their lookups
    are not persisted as a job's hits, misses and lock waits (:meth:`Counters.snapshot`),
    and their misses are no news (:func:`fa4cache.store.nearmiss.report`)."""
    global _NOT_A_JOB
    _NOT_A_JOB = True


def is_warm_process() -> bool:
    return _NOT_A_JOB


# Called before each flush so that lock-free counters elsewhere can be folded in.
_before_flush: list[Callable[[], None]] = []


def before_flush(hook: Callable[[], None]) -> None:
    """Call ``hook()`` before every flush of every store's counters in this process: hit
    counts kept lock-free on a hot path (FA4's caches, ``jit_cache``) are folded in then."""
    if hook not in _before_flush:
        _before_flush.append(hook)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _load(path: Path) -> dict[str, Any] | None:
    """A counters file as a dict, or None if it is missing, not ours, not a regular
    file, too large or not well-formed JSON (never blocks on a FIFO, never follows a link)."""
    try:
        data = read_checked(path, max_bytes=_MAX_STATS_FILE, trusted=only_me(), what="counters file")
        obj = json.loads(data, parse_constant=_reject_constant)
    except (OSError, ValueError, InsecurePath, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


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
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= _MAX_COUNT
    return float(x) if ok else 0.0


def _merge_into(total: dict[str, Any], obj: dict[str, Any]) -> None:
    for part in ("counters", "by_kind"):  # an archive written by damage may hold anything
        if not isinstance(total.get(part), dict):
            total[part] = {}
    counters = _dict(obj.get("counters"))
    for f in FIELDS:
        total["counters"][f] = total["counters"].get(f, 0) + _num(counters.get(f))
    for kind, vals in _dict(obj.get("by_kind")).items():
        if not isinstance(vals, dict) or not _KIND.fullmatch(str(kind)):
            continue  # a kind name is shown on a terminal: nothing but the layout's names
        dst = total["by_kind"].setdefault(str(kind), dict.fromkeys(KIND_FIELDS, 0))
        for f in KIND_FIELDS:
            dst[f] = dst.get(f, 0) + _num(vals.get(f))


def _empty() -> dict[str, Any]:
    return {"counters": dict.fromkeys(FIELDS, 0), "by_kind": {}, "by_host": {}}


def aggregate(stats_dir: Path, *, apply_zero: bool = True) -> dict[str, Any]:
    """Totals over every process that used the store (archive + live files - zero point)."""
    total = _empty()
    archive = _load(stats_dir / ARCHIVE) or {}
    merged = _names(archive.get("merged"))
    for host, obj in _dict(archive.get("by_host")).items():
        if isinstance(obj, dict):
            _merge_into(total, obj)
            _merge_into(total["by_host"].setdefault(_host(host), _empty()), obj)
    processes = 0
    for name, obj in _iter_process_files(stats_dir):
        if name in merged:
            continue
        processes += 1
        _merge_into(total, obj)
        _merge_into(total["by_host"].setdefault(_host(obj.get("host")), _empty()), obj)
    total["processes"] = processes + int(_num(archive.get("processes")))
    if apply_zero:
        zero = _load(stats_dir / ZERO)
        if zero:
            _subtract(total, zero)
    for h in total["by_host"].values():
        h.pop("by_host", None)
    return total


def _names(x: Any) -> set[str]:
    return {n for n in x if isinstance(n, str)} if isinstance(x, list) else set()


def _host(x: Any) -> str:
    # Shown on a terminal: printable characters only.
    text = str(x) if isinstance(x, str) else "?"
    return "".join(c if c.isprintable() else "?" for c in text)[:64] or "?"


def _subtract(total: dict[str, Any], zero: dict[str, Any]) -> None:
    for f in FIELDS:
        total["counters"][f] = max(0, total["counters"][f] - _num(_dict(zero.get("counters")).get(f)))
    for kind, vals in _dict(zero.get("by_kind")).items():
        if kind in total["by_kind"] and isinstance(vals, dict):
            for f in KIND_FIELDS:
                total["by_kind"][kind][f] = max(0, total["by_kind"][kind][f] - _num(vals.get(f)))
    for host, obj in _dict(zero.get("by_host")).items():
        if host in total["by_host"] and isinstance(obj, dict):
            _subtract(total["by_host"][host], {**obj, "by_host": {}})


def check_stats_dir(stats_dir: Path) -> None:
    """Raise :class:`InsecurePath` unless ``stats_dir`` is a real directory of ours:
    compaction deletes and rewrites files there."""
    try:
        why = dir_problem(stats_dir, trusted=only_me(), what="stats directory")
    except FileNotFoundError:
        return
    if why:
        raise InsecurePath(why + "; not reading or writing counters there")


def zero(stats_dir: Path) -> None:
    """Make the current totals the new zero point (``fa4cache stats --zero``)."""
    check_stats_dir(stats_dir)
    makedirs_private(stats_dir)
    snap = aggregate(stats_dir, apply_zero=False)
    atomic_write(stats_dir / ZERO, json.dumps(snap).encode())


def compact(stats_dir: Path, *, older_than: float = 3600.0) -> int:
    """Fold files of finished processes into the archive; returns how many were folded.

    Only files not updated for ``older_than`` seconds, or of dead local processes, are
    folded; a live process would otherwise recreate its file and be counted twice.
    """
    import filelock

    check_stats_dir(stats_dir)
    host = socket.gethostname()
    try:
        lock = filelock.FileLock(str(stats_dir / ".compact.lock"), timeout=0)
        lock.acquire()
    except (filelock.Timeout, OSError):
        return 0
    try:
        archive = _load(stats_dir / ARCHIVE) or {"by_host": {}, "merged": [], "processes": 0}
        merged = _names(archive.get("merged"))
        archive["by_host"] = _dict(archive.get("by_host"))
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
            dst = archive["by_host"].setdefault(_host(obj.get("host")), {"counters": {}, "by_kind": {}})
            if not isinstance(dst, dict):
                dst = archive["by_host"][_host(obj.get("host"))] = {"counters": {}, "by_kind": {}}
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
