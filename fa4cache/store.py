"""The persistent kernel store: content-addressed, file-locked, atomically published.

Layout under the store directory (everything 0700/0600, owned by the user)::

    v1/<toolchain>/toolchain.json        what the toolchain id stands for
    v1/<toolchain>/<kind>/<digest>.o     the artifact (an exported object file)
    v1/<toolchain>/<kind>/<digest>.json  its sidecar: checksum, size, key, timings, use
    locks/<digest>.lock                  per-key lock: single-flight compile + publish
    quarantine/                          artifacts that failed verification, kept for inspection
    stats/                               per-process counters (see :mod:`fa4cache.counters`)

Only hex digests ever become path components, never key material. Readers take no
lock: an entry is published by rename, so it is either absent or complete, and a
reader that opened it keeps reading it even if a concurrent prune unlinks it.
The store knows nothing about FA4: artifacts are opaque bytes. The FA4 adapter
(:mod:`fa4cache.adapters.flash_attn`) exports and loads them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import counters as _counters
from .errors import ConfigError, InsecurePath
from .fsutil import (
    NOFOLLOW,
    atomic_write,
    check_secure,
    clean_stale_tmp,
    ensure_private_dir,
    publish_file,
    read_secure,
    tmp_name,
)
from .hashing import sha256_bytes
from .settings import Settings

log = logging.getLogger(__name__)

LAYOUT = "v1"
SIDECAR_FORMAT = 1
MAX_SIDECAR_BYTES = 256 * 1024
MAX_ARTIFACT_BYTES = 512 * 1024 * 1024
_HEX = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[a-z0-9][a-z0-9_]{0,63}")
_TC = re.compile(r"[0-9a-f]{8,64}")


@dataclass(frozen=True)
class EntryRef:
    """Names one entry: toolchain namespace, kernel kind, key digest."""

    toolchain: str
    kind: str
    digest: str

    def __post_init__(self) -> None:
        # Validated here so that no caller can smuggle a path through a ref.
        if not _TC.fullmatch(self.toolchain):
            raise ConfigError(f"invalid toolchain id {self.toolchain!r}")
        if not _NAME.fullmatch(self.kind):
            raise ConfigError(f"invalid kernel kind {self.kind!r}")
        if not _HEX.fullmatch(self.digest):
            raise ConfigError(f"invalid digest {self.digest!r}")


@dataclass(frozen=True)
class Artifact:
    """A verified artifact ready to load."""

    ref: EntryRef
    path: Path
    data: bytes
    sidecar: dict[str, Any]
    from_base: bool


@dataclass(frozen=True)
class EntryInfo:
    ref: EntryRef
    root: Path
    size: int
    mtime: float
    sidecar: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def object_path(self) -> Path:
        return self.root / LAYOUT / self.ref.toolchain / self.ref.kind / f"{self.ref.digest}.o"


def parse_sidecar(data: bytes, ref: EntryRef) -> dict[str, Any] | None:
    """The sidecar as a dict if it is well-formed for ``ref``, else None (treated as corrupt)."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    ok = (
        obj.get("format") == SIDECAR_FORMAT
        and obj.get("kind") == ref.kind
        and obj.get("digest") == ref.digest
        and isinstance(obj.get("size"), int)
        and not isinstance(obj.get("size"), bool)
        and 0 < obj["size"] <= MAX_ARTIFACT_BYTES
        and isinstance(obj.get("sha256"), str)
        and _HEX.fullmatch(obj["sha256"]) is not None
    )
    if not ok:
        return None
    for name in ("compile_seconds", "created", "last_used"):
        if name in obj and not isinstance(obj[name], (int, float)):
            return None
    if "hits" in obj and not isinstance(obj["hits"], int):
        return None
    return obj


class Store:
    """A store directory plus optional read-only base stores.

    Example::

        store = Store()                       # FA4CACHE_DIR or ~/.cache/fa4cache
        ref = EntryRef(store_toolchain, "fwd", digest)
        art = store.load(ref)                 # None on a miss (or a corrupt entry, quarantined)
    """

    def __init__(self, settings: Settings | None = None, **options: Any) -> None:
        self.settings = settings if settings is not None else Settings.from_env(**options)
        self.root = self.settings.cache_dir
        self.writable = True
        self._warned: set[str] = set()
        self._publishes = 0
        self._checked_dirs: set[Path] = set()
        self._touches: list[tuple[Artifact, float]] = []
        self._touch_lock = threading.Lock()
        try:
            ensure_private_dir(self.root, trust_shared=False)
            for sub in ("locks", "quarantine", "stats", LAYOUT):
                ensure_private_dir(self.root / sub)
        except InsecurePath as e:
            if self.settings.insecure_policy == "refuse":
                raise
            self._warn_once("insecure-root", f"fa4cache: {e}; using an in-memory cache only")
            self.writable = False
        except OSError as e:
            # Read-only filesystem, permission denied, full disk: kernels still work,
            # they are just not persisted.
            self._warn_once(
                "unwritable", f"fa4cache: cannot use {self.root} ({e}); kernels will not be persisted"
            )
            self.writable = False
        self.counters = _counters.Counters(self.root / "stats" if self.writable else None)
        if self.writable:
            import atexit

            atexit.register(self.flush_touches)
        self.bases = tuple(self._usable_base(b) for b in self.settings.base_dirs)
        self.bases = tuple(b for b in self.bases if b is not None)

    # ------------------------------------------------------------------ helpers

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning(message)

    def _usable_base(self, path: Path) -> Path | None:
        try:
            st = os.lstat(path)
        except OSError as e:
            self._warn_once(f"base:{path}", f"fa4cache: base store {path} is not usable ({e}); ignoring it")
            return None
        problem = check_secure(st, path, trust_shared=self.settings.trust_shared, what="base store")
        if problem or not stat.S_ISDIR(st.st_mode):
            msg = problem or f"base store {path} is not a directory"
            if self.settings.insecure_policy == "refuse" and problem:
                raise InsecurePath(msg + " (set FA4CACHE_TRUST_SHARED=1 to trust a shared read-only cache)")
            self._warn_once(f"base:{path}", f"fa4cache: {msg}; ignoring it")
            return None
        return path

    def entry_dir(self, ref: EntryRef, root: Path | None = None) -> Path:
        return (root or self.root) / LAYOUT / ref.toolchain / ref.kind

    def object_path(self, ref: EntryRef, root: Path | None = None) -> Path:
        return self.entry_dir(ref, root) / f"{ref.digest}.o"

    def sidecar_path(self, ref: EntryRef, root: Path | None = None) -> Path:
        return self.entry_dir(ref, root) / f"{ref.digest}.json"

    def lock_path(self, digest: str) -> Path:
        return self.root / "locks" / f"{digest}.lock"

    def lock(self, digest: str, timeout: float | None = None) -> Any:
        """A cross-process lock for one key (``filelock.FileLock``, not yet acquired)."""
        import filelock

        t = self.settings.lock_timeout if timeout is None else timeout
        return filelock.FileLock(str(self.lock_path(digest)), timeout=t, is_singleton=False)

    def acquire(self, digest: str, *, timeout: float | None = None) -> Any | None:
        """Acquire the key lock, counting waits. Returns the held lock, or None when no
        lock could be had (read-only store, or timeout: the caller compiles anyway)."""
        if not self.writable:
            return None
        import filelock

        lk = self.lock(digest, timeout=0)
        try:
            lk.acquire(timeout=0)
            return lk
        except filelock.Timeout:
            pass
        except OSError as e:
            self._warn_once(
                "lock",
                f"fa4cache: cannot lock {self.lock_path(digest)} ({e}); compiling without single-flight",
            )
            return None
        # Someone else holds it: most likely compiling this very kernel. Wait for them.
        t0 = time.perf_counter()
        timeout = self.settings.lock_timeout if timeout is None else timeout
        try:
            lk.acquire(timeout=timeout)
            return lk
        except filelock.Timeout:
            self.counters.add("lock_timeouts")
            log.warning(
                "fa4cache: waited %.0fs for another process to compile %s; compiling it here too "
                "(raise FA4CACHE_LOCK_TIMEOUT if compiles are this slow)",
                timeout,
                digest[:16],
            )
            return None
        finally:
            waited = time.perf_counter() - t0
            self.counters.add("lock_waits")
            self.counters.add("lock_wait_seconds", waited)

    def write_toolchain(self, toolchain_id: str, description: dict[str, Any]) -> None:
        if not self.writable:
            return
        d = self.root / LAYOUT / toolchain_id
        path = d / "toolchain.json"
        if path.exists():
            return
        try:
            ensure_private_dir(d)
            atomic_write(path, json.dumps(description, sort_keys=True, indent=1).encode())
        except OSError as e:
            self._warn_once("publish", f"fa4cache: cannot write to {d} ({e}); kernels will not be persisted")

    # ------------------------------------------------------------------ read path

    def load(self, ref: EntryRef) -> Artifact | None:
        """Find and verify ``ref`` in the local store, then in the base stores.

        A corrupt local entry is quarantined and counted; the caller recompiles.
        """
        roots: list[tuple[Path, bool]] = []
        if self.writable:
            roots.append((self.root, False))
        roots.extend((b, True) for b in self.bases)
        for root, is_base in roots:
            art = self._load_from(ref, root, is_base)
            if art is not None:
                return art
        return None

    def _check_chain(self, ref: EntryRef, root: Path, trust: bool) -> str | None:
        """Why a directory between ``root`` and the entry is unsafe (symlink, foreign owner,
        group/other-writable), or None. Each directory is checked once per process."""
        d = root
        for part in (LAYOUT, ref.toolchain, ref.kind):
            d = d / part
            if d in self._checked_dirs:
                continue
            try:
                st = os.lstat(d)
            except FileNotFoundError:
                return ""
            problem = check_secure(st, d, trust_shared=trust, what="directory")
            if problem is None and not stat.S_ISDIR(st.st_mode):
                problem = f"{d} is not a directory"
            if problem:
                return problem
            self._checked_dirs.add(d)
        return None

    def _load_from(self, ref: EntryRef, root: Path, is_base: bool) -> Artifact | None:
        trust = self.settings.trust_shared and is_base
        chain = self._check_chain(ref, root, trust)
        if chain == "":
            return None
        if chain:
            return self._insecure(ref, root, is_base, chain)
        obj_path = self.object_path(ref, root)
        side_path = self.sidecar_path(ref, root)
        try:
            side_bytes = read_secure(
                side_path, max_bytes=MAX_SIDECAR_BYTES, trust_shared=trust, what="sidecar"
            )
        except FileNotFoundError:
            return None
        except InsecurePath as e:
            return self._insecure(ref, root, is_base, str(e))
        except (OSError, ValueError) as e:
            return self._corrupt(ref, root, is_base, f"unreadable sidecar: {e}")
        sidecar = parse_sidecar(side_bytes, ref)
        if sidecar is None:
            return self._corrupt(ref, root, is_base, "malformed sidecar")
        try:
            data = read_secure(obj_path, max_bytes=MAX_ARTIFACT_BYTES, trust_shared=trust, what="artifact")
        except FileNotFoundError:
            # Sidecar without artifact: a publish was interrupted between the two renames.
            return self._corrupt(ref, root, is_base, "artifact missing")
        except InsecurePath as e:
            return self._insecure(ref, root, is_base, str(e))
        except (OSError, ValueError) as e:
            return self._corrupt(ref, root, is_base, f"unreadable artifact: {e}")
        if len(data) != sidecar["size"] or sha256_bytes(data) != sidecar["sha256"]:
            return self._corrupt(
                ref, root, is_base, f"checksum mismatch ({len(data)} bytes, expected {sidecar['size']})"
            )
        return Artifact(ref=ref, path=obj_path, data=data, sidecar=sidecar, from_base=is_base)

    def _insecure(self, ref: EntryRef, root: Path, is_base: bool, why: str) -> None:
        self.counters.add("insecure")
        self._warn_once(
            f"insecure:{ref.digest}", f"fa4cache: refusing to load {ref.kind} entry {ref.digest[:16]}: {why}"
        )
        return None

    def _corrupt(self, ref: EntryRef, root: Path, is_base: bool, why: str) -> None:
        self.counters.add("corrupt")
        log.warning(
            "fa4cache: corrupt %s entry %s in %s: %s; recompiling", ref.kind, ref.digest[:16], root, why
        )
        if not is_base:
            self.quarantine(ref, why)
        return None

    def quarantine(self, ref: EntryRef, reason: str) -> list[Path]:
        """Move an entry's files to ``quarantine/`` (atomic renames). Returns the new paths."""
        moved = []
        qdir = self.root / "quarantine"
        stamp = time.time_ns()
        # Sidecar first: a kill in between leaves an artifact without sidecar, which
        # loaders ignore (a miss), never a sidecar without its artifact.
        for src, ext in ((self.sidecar_path(ref), "json"), (self.object_path(ref), "o")):
            dst = qdir / f"{ref.digest}.{stamp}.{ext}"
            try:
                os.replace(src, dst)
                moved.append(dst)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("fa4cache: cannot quarantine %s (%s)", src, e)
        if moved:
            try:
                atomic_write(qdir / f"{ref.digest}.{stamp}.reason", reason.encode(), durable=False)
            except OSError:
                pass
        return moved

    def touch(self, art: Artifact) -> None:
        """Record a use (last_used, hits) in the sidecar, later: uses are written in a
        batch by :meth:`flush_touches` (at exit and after compiles), off the load path."""
        if art.from_base or not self.writable:
            return
        with self._touch_lock:
            self._touches.append((art, time.time()))

    def flush_touches(self) -> None:
        """Write pending uses into sidecars; best effort, never blocks on a busy entry."""
        import filelock

        with self._touch_lock:
            pending, self._touches = self._touches, []
        for art, when in pending:
            lk = self.lock(art.ref.digest, timeout=0)
            try:
                lk.acquire(timeout=0)
            except (filelock.Timeout, OSError):
                continue
            try:
                # Re-read: another process may have recorded uses since we loaded it.
                try:
                    cur = parse_sidecar(
                        read_secure(
                            self.sidecar_path(art.ref), max_bytes=MAX_SIDECAR_BYTES, trust_shared=False
                        ),
                        art.ref,
                    )
                except (OSError, ValueError):
                    cur = None
                if cur is None or cur.get("sha256") != art.sidecar.get("sha256"):
                    continue
                cur["last_used"] = max(float(cur.get("last_used", 0)), when)
                cur["hits"] = int(cur.get("hits", 0)) + 1
                atomic_write(self.sidecar_path(art.ref), json.dumps(cur).encode(), durable=False)
            except OSError:
                pass
            finally:
                lk.release()

    # ------------------------------------------------------------------ write path

    def staging_path(self, ref: EntryRef) -> Path | None:
        """Where an exporter should write a new artifact (then call :meth:`publish`)."""
        if not self.writable:
            return None
        d = self.entry_dir(ref)
        try:
            ensure_private_dir(d.parent)
            ensure_private_dir(d)
        except InsecurePath as e:
            self.counters.add("insecure")
            self._warn_once(f"insecure-dir:{d}", f"fa4cache: not publishing into {d}: {e}")
            return None
        except OSError as e:
            self._publish_failed(e)
            return None
        return tmp_name(self.object_path(ref))

    def publish(self, ref: EntryRef, staged: Path, meta: dict[str, Any]) -> bool:
        """Publish a staged artifact and its sidecar. The caller holds the key lock.

        On any failure (ENOSPC, read-only, a crash in between) nothing half-written is
        visible: the artifact appears by rename, and a missing sidecar makes it a miss.
        """
        try:
            fd = os.open(staged, os.O_RDONLY | NOFOLLOW)
            try:
                data = b""
                while chunk := os.read(fd, 1 << 22):
                    data += chunk
            finally:
                os.close(fd)
            if not data:
                raise OSError(f"exporter wrote an empty file {staged}")
            now = time.time()
            sidecar = {
                "format": SIDECAR_FORMAT,
                "kind": ref.kind,
                "digest": ref.digest,
                "toolchain": ref.toolchain,
                "size": len(data),
                "sha256": sha256_bytes(data),
                "created": now,
                "last_used": now,
                "hits": 0,
                "host": socket.gethostname(),
                **{k: v for k, v in meta.items() if k not in ("format", "kind", "digest", "size", "sha256")},
            }
            # The sidecar goes away first: a crash after that leaves an orphan artifact
            # (a miss), never a sidecar that vouches for the old bytes.
            try:
                os.unlink(self.sidecar_path(ref))
            except FileNotFoundError:
                pass
            publish_file(staged, self.object_path(ref))
            atomic_write(self.sidecar_path(ref), json.dumps(sidecar).encode())
        except OSError as e:
            try:
                os.unlink(staged)
            except OSError:
                pass
            self._publish_failed(e)
            return False
        self._publishes += 1
        if self.settings.max_size is not None:
            self._enforce_cap()
        return True

    def _publish_failed(self, e: OSError) -> None:
        self.counters.add("publish_errors")
        self._warn_once(
            "publish", f"fa4cache: cannot write to {self.root} ({e}); kernels stay in memory only"
        )

    def _enforce_cap(self) -> None:
        cap = self.settings.max_size
        assert cap is not None
        total = sum(e.size for e in self.iter_entries())
        if total > cap:
            self.prune(max_size=cap)

    # ------------------------------------------------------------------ inspection and upkeep

    def toolchains(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root / LAYOUT) if _TC.fullmatch(n))
        except OSError:
            return []

    def iter_entries(
        self, *, toolchain: str | None = None, kind: str | None = None, sidecars: bool = False
    ) -> Iterator[EntryInfo]:
        for tc in [toolchain] if toolchain else self.toolchains():
            tdir = self.root / LAYOUT / tc
            try:
                kinds = [k for k in os.listdir(tdir) if _NAME.fullmatch(k) and (kind is None or k == kind)]
            except OSError:
                continue
            for k in sorted(kinds):
                try:
                    it = os.scandir(tdir / k)
                except OSError:
                    continue
                with it:
                    for ent in it:
                        name = ent.name
                        if not name.endswith(".o") or not _HEX.fullmatch(name[:-2]):
                            continue
                        try:
                            st = ent.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        ref = EntryRef(tc, k, name[:-2])
                        side = None
                        if sidecars:
                            try:
                                side = parse_sidecar(
                                    read_secure(
                                        self.sidecar_path(ref),
                                        max_bytes=MAX_SIDECAR_BYTES,
                                        trust_shared=False,
                                    ),
                                    ref,
                                )
                            except (OSError, ValueError):
                                side = None
                        yield EntryInfo(
                            ref=ref, root=self.root, size=st.st_size, mtime=st.st_mtime, sidecar=side
                        )

    def remove(self, ref: EntryRef, *, wait: bool = False) -> bool:
        """Delete one entry under its key lock; skipped (False) if someone is publishing it."""
        import filelock

        lk = self.lock(ref.digest, timeout=self.settings.lock_timeout if wait else 0)
        try:
            lk.acquire()
        except filelock.Timeout:
            return False
        try:
            # Sidecar first: a reader that finds no sidecar treats the entry as a miss.
            for p in (self.sidecar_path(ref), self.object_path(ref)):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            return True
        finally:
            lk.release()

    def verify(self, *, repair: bool = False) -> dict[str, Any]:
        """Check every entry's sidecar and checksum. With ``repair``, quarantine bad ones."""
        report: dict[str, Any] = {"checked": 0, "ok": 0, "bad": [], "orphans": [], "repaired": 0}
        for info in self.iter_entries():
            report["checked"] += 1
            ref = info.ref
            problem = None
            try:
                side_bytes = read_secure(
                    self.sidecar_path(ref), max_bytes=MAX_SIDECAR_BYTES, trust_shared=False
                )
                side = parse_sidecar(side_bytes, ref)
                if side is None:
                    problem = "malformed sidecar"
                else:
                    data = read_secure(info.object_path, max_bytes=MAX_ARTIFACT_BYTES, trust_shared=False)
                    if len(data) != side["size"] or sha256_bytes(data) != side["sha256"]:
                        problem = "checksum mismatch"
            except FileNotFoundError:
                # Normal for a moment during a publish; the publisher holds the key lock.
                if self._locked_by_other(ref.digest):
                    report["ok"] += 1
                    continue
                problem = "missing sidecar"
            except (OSError, ValueError) as e:
                problem = str(e)
            if problem is None:
                report["ok"] += 1
                continue
            entry = {"kind": ref.kind, "digest": ref.digest, "toolchain": ref.toolchain, "problem": problem}
            if problem == "missing sidecar":
                report["orphans"].append(entry)
                if repair and self.remove(ref):
                    report["repaired"] += 1
                continue
            report["bad"].append(entry)
            if repair and self.quarantine(ref, problem):
                report["repaired"] += 1
        # Sidecars with no artifact are harmless misses; repair removes them.
        for tc in self.toolchains():
            for kdir in (self.root / LAYOUT / tc).glob("*/"):
                for side in kdir.glob("*.json"):
                    if not (kdir / (side.stem + ".o")).exists() and _HEX.fullmatch(side.stem):
                        report["orphans"].append(
                            {"kind": kdir.name, "digest": side.stem, "problem": "sidecar without artifact"}
                        )
                        if repair:
                            side.unlink(missing_ok=True)
                            report["repaired"] += 1
        # Orphans (one half of an interrupted publish) are never loaded: they are debris,
        # reported and removed by repair, but they do not make the store unclean.
        report["clean"] = not report["bad"]
        return report

    def _locked_by_other(self, digest: str) -> bool:
        import filelock

        lk = self.lock(digest, timeout=0)
        try:
            lk.acquire(timeout=0)
        except filelock.Timeout:
            return True
        except OSError:
            return False
        lk.release()
        return False

    def prune(
        self,
        *,
        max_size: int | None = None,
        older_than: float | None = None,
        stale_toolchains: bool = False,
        current_toolchain: str | None = None,
    ) -> dict[str, Any]:
        """Evict entries: other toolchains (``stale_toolchains``), unused for ``older_than``
        seconds, then least recently used until the store fits ``max_size`` bytes."""
        entries = list(self.iter_entries(sidecars=True))
        now = time.time()

        def last_used(e: EntryInfo) -> float:
            return float((e.sidecar or {}).get("last_used", e.mtime))

        removed: list[EntryInfo] = []
        kept: list[EntryInfo] = []
        for e in entries:
            stale = (
                stale_toolchains and current_toolchain is not None and e.ref.toolchain != current_toolchain
            )
            old = older_than is not None and now - last_used(e) > older_than
            if (stale or old) and self.remove(e.ref):
                removed.append(e)
            else:
                kept.append(e)
        if max_size is not None:
            total = sum(e.size for e in kept)
            # Other toolchains go first, then least recently used.
            order = sorted(kept, key=lambda e: (e.ref.toolchain == current_toolchain, last_used(e)))
            for e in order:
                if total <= max_size:
                    break
                if self.remove(e.ref):
                    removed.append(e)
                    total -= e.size
        self.counters.add("evictions", len(removed))
        for tc in self.toolchains():
            clean_stale_tmp_tree(self.root / LAYOUT / tc)
        return {
            "removed": len(removed),
            "freed_bytes": sum(e.size for e in removed),
            "remaining": len(entries) - len(removed),
            "remaining_bytes": sum(e.size for e in entries) - sum(e.size for e in removed),
        }

    def clear(self, *, everything: bool = False) -> int:
        """Remove every entry (under their key locks). ``everything`` also drops counters,
        quarantine and lock files."""
        n = 0
        for e in list(self.iter_entries()):
            if self.remove(e.ref, wait=True):
                n += 1
        if everything:
            for sub in ("quarantine", "stats"):
                d = self.root / sub
                for p in d.iterdir() if d.exists() else ():
                    if p.is_file() and not p.is_symlink():
                        p.unlink(missing_ok=True)
            for tc in self.toolchains():
                shutil.rmtree(self.root / LAYOUT / tc, ignore_errors=True)
        return n


def clean_stale_tmp_tree(root: Path) -> int:
    n = 0
    for dirpath, _dirs, _files in os.walk(root):
        n += clean_stale_tmp(Path(dirpath))
    return n
