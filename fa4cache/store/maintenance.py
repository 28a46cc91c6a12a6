"""Store upkeep: verify, prune, clear. Every deletion happens under the key's lock and
only in directories the layout trusts (real directories of ours, never through links).

Each operation returns a report instead of raising on the first problem: a held key,
an unusable lock file or a read-only store is counted as ``skipped`` / ``failed`` so
that the CLI can say what it did not do and exit non-zero.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from fa4cache.store.paths import TOOLCHAIN_FILE, EntryInfo, EntryRef

from .locks import release
from .secure_io import NotRegularFile, clean_stale_tmp, only_me, read_checked, unlink_quiet
from .sidecar import MAX_ARTIFACT_BYTES, MAX_SIDECAR_BYTES, Sidecar
from .store import Store

DAY = 86400.0


@dataclass
class Report:
    removed: list[EntryInfo] = field(default_factory=list)
    skipped: list[EntryRef] = field(default_factory=list)  # key held by another process
    failed: list[tuple[EntryRef, str]] = field(default_factory=list)  # could not delete
    removed_toolchains: list[str] = field(default_factory=list)  # empty toolchain directories
    temp_files: int = 0  # dead writers' temp files

    @property
    def freed_bytes(self) -> int:
        return sum(e.size for e in self.removed)


def _remove(store: Store, info: EntryInfo, report: Report, dry_run: bool = False) -> None:
    """Delete one entry under its key lock (never waits: a held key is being published);
    ``dry_run``: only report it."""
    if dry_run:
        report.removed.append(info)
        return
    ref = info.ref
    try:
        lk = store.locks.try_lock(ref.digest)
    except OSError as e:
        report.failed.append((ref, str(e)))
        return
    if lk is None:
        report.skipped.append(ref)
        return
    try:
        # Sidecar first: a reader that finds no sidecar treats the entry as a miss.
        for p in (store.layout.sidecar_path(ref), store.layout.object_path(ref), store.layout.use_path(ref)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        report.removed.append(info)
    except OSError as e:
        report.failed.append((ref, str(e)))
    finally:
        release(lk)


def remove(store: Store, ref: EntryRef) -> bool:
    """Delete one entry under its key lock; False if the key is held or it failed."""
    r = Report()
    _remove(store, EntryInfo(ref, 0, 0.0), r)
    return bool(r.removed)


def last_used(store: Store, e: EntryInfo) -> float:
    rec = store.read_use(e.ref)
    return rec.last_used if rec is not None else e.mtime


def stale_toolchains(store: Store, *, unused_for: float = DAY, now: float | None = None) -> list[str]:
    """Toolchains not used for ``unused_for`` seconds, by their recorded last use; the
    most recently used toolchain is never stale."""
    now = time.time() if now is None else now
    lay = store.layout
    newest = lay.most_recent_toolchain()
    out = []
    for tc in lay.toolchains():
        t = lay.toolchain_last_used(tc)
        if tc != newest and (t is None or now - t > unused_for):
            out.append(tc)
    return out


@dataclass(frozen=True)
class PrunePlan:
    """What a prune removes, chosen once from the store's files: ``fa4cache prune --dry-run``
    prints it, the confirmation counts it and the real run removes it (one selection)."""

    entries: tuple[EntryInfo, ...]  # to remove, in this order
    stale_toolchains: tuple[str, ...]  # their directories go once no entry is left in them
    total_entries: int  # what the store held when the plan was made
    total_bytes: int
    # ``max_size`` only: the next least recently used entries, which :func:`apply_prune`
    # removes in place of held ones when asked to (the cap on publish); never shown.
    spare: tuple[EntryInfo, ...] = ()
    max_size: int | None = None

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def removes_most(self) -> bool:
        """More than half of the store's entries or of its bytes: a run to confirm."""
        return 2 * len(self.entries) > self.total_entries or 2 * self.bytes > self.total_bytes


def plan_prune(
    store: Store,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    stale_after: float | None = None,
    now: float | None = None,
) -> PrunePlan:
    """Entries of stale toolchains (``stale_after``: unused for that long), entries unused for
    ``older_than`` seconds, then least recently used ones (other toolchains first) until the
    store fits ``max_size`` bytes."""
    entries = list(store.layout.iter_entries())
    now = time.time() if now is None else now
    stale = (
        sorted(stale_toolchains(store, unused_for=stale_after, now=now)) if stale_after is not None else []
    )
    uses = {e.ref: last_used(store, e) for e in entries}
    chosen, kept = [], []
    for e in entries:
        if e.ref.toolchain in stale or (older_than is not None and now - uses[e.ref] > older_than):
            chosen.append(e)
        else:
            kept.append(e)
    spare: list[EntryInfo] = []
    if max_size is not None:
        total = sum(e.size for e in kept)
        recent = store.layout.most_recent_toolchain()
        for e in sorted(kept, key=lambda e: (e.ref.toolchain == recent, uses[e.ref])):
            if total <= max_size:
                spare.append(e)
            else:
                chosen.append(e)
                total -= e.size
    return PrunePlan(
        tuple(chosen),
        tuple(stale),
        len(entries),
        sum(e.size for e in entries),
        spare=tuple(spare),
        max_size=max_size,
    )


def apply_prune(store: Store, plan: PrunePlan, *, replace_held: bool = False) -> Report:
    """Remove what ``plan`` names (each under its key lock; a held key is skipped and
    reported), then the stale toolchains' directories once empty and dead writers' temp
    files. ``replace_held``: with a ``max_size`` plan, an entry that could not be removed
    is made up for by the next least recently used one, so that the store still fits."""
    report = Report()
    for e in plan.entries:
        _remove(store, e, report)
    if replace_held and plan.max_size is not None:
        over = sum(e.size for e in plan.entries) - report.freed_bytes
        for e in plan.spare:
            if over <= 0:
                break
            n = len(report.removed)
            _remove(store, e, report)
            if len(report.removed) > n:
                over -= e.size
    store.counters.add("evictions", len(report.removed))
    report.temp_files = clean_temp_files(store)
    for tc in plan.stale_toolchains:
        if _remove_empty_toolchain(store, tc):
            report.removed_toolchains.append(tc)
    return report


def dry_run_report(store: Store, plan: PrunePlan) -> Report:
    """What :func:`apply_prune` would report if no key were held: nothing removed."""
    report = Report(removed=list(plan.entries))
    report.removed_toolchains = [tc for tc in plan.stale_toolchains if _empty_after(store, tc, report)]
    report.temp_files = clean_temp_files(store, dry_run=True)
    return report


def prune(
    store: Store,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    stale_after: float | None = None,
    dry_run: bool = False,
) -> Report:
    """:func:`plan_prune`, then :func:`apply_prune` (a held entry is made up for by the next
    least recently used one); ``dry_run``: report what would go."""
    plan = plan_prune(store, max_size=max_size, older_than=older_than, stale_after=stale_after)
    if dry_run:
        return dry_run_report(store, plan)
    return apply_prune(store, plan, replace_held=True)


def _empty_after(store: Store, tc: str, report: Report) -> bool:
    gone = {e.ref for e in report.removed}
    return all(e.ref in gone for e in store.layout.iter_entries(toolchain=tc))


def _remove_empty_toolchain(store: Store, tc: str) -> bool:
    """Remove a stale toolchain's directory if no entry is left in it (a held entry keeps
    it). Only empty kind directories and the toolchain record go; ``rmdir`` refuses
    anything a concurrent publish has just put there."""
    lay = store.layout
    if lay.has_entries(tc):
        return False
    tdir = lay.toolchain_dir(tc)
    try:
        for k in lay.kinds(tc):
            clean_stale_tmp(tdir / k)
            os.rmdir(tdir / k)
        unlink_quiet(tdir / TOOLCHAIN_FILE)
        os.rmdir(tdir)
    except OSError:
        return False
    return True


def clean_temp_files(store: Store, *, dry_run: bool = False) -> int:
    """Remove dead writers' temp files (this host's by pid, any host's by age) in every
    entry directory; returns how many (``dry_run``: only count them)."""
    lay = store.layout
    n = 0
    for tc in lay.toolchains():
        for d in (lay.toolchain_dir(tc), *(lay.toolchain_dir(tc) / k for k in lay.kinds(tc))):
            n += clean_stale_tmp(d, dry_run=dry_run)
    return n


def enforce_cap(store: Store, cap: int) -> None:
    # Temp files count against the cap like entries: killed writers' leftovers go first,
    # those of writers still running are space the disk does not have either.
    total = sum(e.size for e in store.layout.iter_entries())
    if total + sum(b for _, b in store.layout.iter_temp_files()) <= cap:
        return
    clean_temp_files(store)
    temp = sum(b for _, b in store.layout.iter_temp_files())
    if total + temp > cap:
        prune(store, max_size=max(cap - temp, 0))


def clear(store: Store, *, everything: bool = False, dry_run: bool = False) -> Report:
    """Remove every entry whose key is not held (a held key is being compiled: skipped
    and reported, not waited for). ``everything`` also drops counters and quarantine.
    ``dry_run``: report what would go."""
    report = Report()
    for e in list(store.layout.iter_entries()):
        _remove(store, e, report, dry_run)
    if everything and not dry_run:
        for d in (store.layout.quarantine_dir, store.layout.stats_dir):
            if not store.layout.own_dir(d):
                continue
            for name in os.listdir(d):
                p = d / name
                if p.is_file() and not p.is_symlink():
                    unlink_quiet(p)
    return report


@dataclass
class VerifyReport:
    checked: int = 0
    ok: int = 0
    bad: list[dict[str, str]] = field(default_factory=list)
    orphans: list[dict[str, str]] = field(default_factory=list)
    repaired: int = 0
    repair_failed: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        # Orphans (one half of an interrupted publish) are never loaded: debris, not damage.
        return not self.bad

    def as_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "ok": self.ok,
            "bad": self.bad,
            "orphans": self.orphans,
            "repaired": self.repaired,
            "repair_failed": self.repair_failed,
            "clean": self.clean,
        }


def _check_entry(store: Store, ref: EntryRef) -> str | None:
    mine = only_me()
    lay = store.layout
    side = Sidecar.parse(read_checked(lay.sidecar_path(ref), max_bytes=MAX_SIDECAR_BYTES, trusted=mine), ref)
    if side is None:
        return "malformed sidecar"
    unbound = side.key_problem(required=False)  # what a load would refuse (and quarantine)
    if unbound:
        return unbound
    data = read_checked(lay.object_path(ref), max_bytes=MAX_ARTIFACT_BYTES, trusted=mine, what="artifact")
    return None if side.matches(data) else "checksum mismatch"


def verify(store: Store, *, repair: bool = False) -> VerifyReport:
    """Check every entry's sidecar and checksum. With ``repair``, quarantine bad entries
    and remove orphans; what could not be repaired is listed in ``repair_failed``."""
    rep = VerifyReport()
    for info in store.layout.iter_entries():
        rep.checked += 1
        ref = info.ref
        try:
            problem = _check_entry(store, ref)
        except FileNotFoundError:
            if store.locks.held_by_other(ref.digest):  # mid-publish: the publisher holds the lock
                rep.ok += 1
                continue
            rep.orphans.append({"kind": ref.kind, "digest": ref.digest, "problem": "missing sidecar"})
            if repair:
                _repair(store, info, rep, remove=True)
            continue
        except (NotRegularFile, ValueError, OSError) as e:
            problem = str(e)
        if problem is None:
            rep.ok += 1
            continue
        rep.bad.append(
            {"kind": ref.kind, "digest": ref.digest, "toolchain": ref.toolchain, "problem": problem}
        )
        if repair:
            _repair(store, info, rep, remove=False)
    for ref in store.layout.iter_sidecars_without_artifact():
        rep.orphans.append({"kind": ref.kind, "digest": ref.digest, "problem": "sidecar without artifact"})
        if repair:
            _repair(store, EntryInfo(ref, 0, 0.0), rep, remove=True)
    return rep


def _repair(store: Store, info: EntryInfo, rep: VerifyReport, *, remove: bool) -> None:
    if not store.writable:
        rep.repair_failed.append(f"{info.ref.digest[:16]}: the store is not writable")
        return
    if remove:
        r = Report()
        _remove(store, info, r)
        ok = bool(r.removed)
        why = "; ".join(w for _, w in r.failed) or "key held by another process"
    else:
        ok = bool(store.quarantine(info.ref, "verify --repair"))
        why = "could not move it to quarantine/"
    if ok:
        rep.repaired += 1
    else:
        rep.repair_failed.append(f"{info.ref.digest[:16]}: {why}")
