"""``fa4cache stats``, ``ls``, ``verify``, ``prune`` and ``clear``: the store, from its files
alone (no torch, cutlass, FA4 or Ray import)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..errors import ConfigError
from ..settings import parse_duration, parse_size
from .common import ago, human, open_store, safe_text, settings_of

log = logging.getLogger(__name__)


def cmd_stats(args: argparse.Namespace) -> int:
    from .. import counters
    from ..stats import collect

    s = settings_of(args)
    if args.zero:
        if not s.cache_dir.exists():
            raise ConfigError(f"cache directory {s.cache_dir} does not exist")
        counters.zero(s.cache_dir / "stats")
        print(f"counters zeroed for {s.cache_dir}")
        return 0
    counters.check_stats_dir(s.cache_dir / "stats")
    if (s.cache_dir / "stats").is_dir():
        try:
            counters.compact(s.cache_dir / "stats")
        except OSError as e:  # full disk, read-only store: the numbers are still right
            log.info("fa4cache stats: not compacting counters (%s)", e)
    st = collect(s.cache_dir)
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return 0
    rate = "-" if st["hit_rate"] is None else f"{100 * st['hit_rate']:.1f} %"
    rows = [
        ("Cache directory", st["cache_dir"]),
        ("Entries", f"{st['entries']}  ({human(st['bytes'])})"),
        ("Hits", f"{st['hits']}  (memory {st['memory_hits']}, disk {st['disk_hits']})"),
        ("Misses", str(st["misses"])),
        ("Hit rate", rate),
        ("Compiles", f"{st['compiles']}  ({st['compile_seconds']:.1f} s spent)"),
        (
            "Compile time saved",
            f"{st['compile_seconds_saved']:.1f} s  (disk hits x mean compile time of their kind)",
        ),
        (
            "Compiled ahead",
            f"{st['ahead_compiles']}  ({st['ahead_saved_seconds']:.1f} s kept off the critical path)",
        ),
        ("Load time", f"{st['load_seconds']:.3f} s"),
        ("Corrupt / quarantined", f"{st['corrupt']} / {st['quarantined']}"),
        ("Refused (insecure)", str(st["insecure"])),
        ("Publish errors", str(st["publish_errors"])),
        (
            "Lock waits",
            f"{st['lock_waits']}  ({st['lock_wait_seconds']:.1f} s, {st['lock_timeouts']} timed out)",
        ),
        ("Evictions", str(st["evictions"])),
        ("Processes", str(st["processes"])),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    if st["by_kind"]:
        print("\nBy kind:")
        kw = max(14, *(len(k) + 2 for k in st["by_kind"]))
        print(
            f"  {'kind':<{kw}}{'entries':>8}{'size':>12}{'compiles':>10}{'disk hits':>11}{'mem hits':>10}{'mean compile':>14}"
        )
        for kind, v in st["by_kind"].items():
            mean = v.get("compile_seconds", 0) / v["compiles"] if v.get("compiles") else None
            print(
                f"  {kind:<{kw}}{v.get('entries', 0):>8}{human(v.get('bytes', 0)):>12}{int(v.get('compiles', 0)):>10}"
                f"{int(v.get('disk_hits', 0)):>11}{int(v.get('memory_hits', 0)):>10}"
                f"{('-' if mean is None else f'{mean:.2f} s'):>14}"
            )
    if st["by_toolchain"]:
        print("\nBy toolchain:")
        for tc, v in st["by_toolchain"].items():
            mark = "  (most recently used)" if v["current"] else ""
            print(f"  {tc}  {v['entries']:>6} entries  {human(v['bytes']):>10}{mark}")
    if len(st["by_host"]) > 1:
        print("\nBy host:")
        for h, v in st["by_host"].items():
            print(
                f"  {safe_text(h):<24} hits {int(v['memory_hits'] + v['disk_hits']):>8}  compiles {int(v['compiles']):>6}  ({v['compile_seconds']:.1f} s)"
            )
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    store = open_store(args)
    rows = []
    for e in store.layout.iter_entries(kind=args.kind):
        side = store.read_sidecar(e.ref)
        use = store.read_use(e.ref)
        rows.append(
            {
                "toolchain": e.ref.toolchain,
                "kind": e.ref.kind,
                "digest": e.ref.digest,
                "size": e.size,
                "compile_seconds": side.compile_seconds if side else None,
                "created": side.created if side else None,
                "last_used": use.last_used if use else None,
                "hits": use.hits if use else 0,
                "summary": side.summary if side else {},
                "spec": side.spec if side else None,
                "valid_sidecar": side is not None,
            }
        )
    rows.sort(key=lambda r: (r["kind"], -(r["last_used"] or 0)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'kind':<16}{'digest':<14}{'dtype':<10}{'hdim':>5}  {'mask':<14}{'size':>10}{'compile':>9}  {'last used':<12}{'hits':>6}"
    )
    for r in rows:
        s = r["summary"]
        mask = (r["spec"] or {}).get("mask") or s.get("mask") or "-"
        cs = r["compile_seconds"]
        print(
            f"{r['kind'][:15]:<16}{r['digest'][:12]:<14}{safe_text(s.get('dtype', '-'))[:9]:<10}{safe_text(s.get('head_dim', '-'))[:5]:>5}  "
            f"{safe_text(mask)[:13]:<14}{human(r['size']):>10}{('-' if cs is None else f'{cs:.1f}s'):>9}  "
            f"{ago(r['last_used']):<12}{r['hits']:>6}"
        )
    print(f"{len(rows)} entries")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from ..maintenance import verify

    store = open_store(args)
    rep = verify(store, repair=args.repair)
    if args.json:
        print(json.dumps(rep.as_dict(), indent=2))
    else:
        print(
            f"checked {rep.checked} entries: {rep.ok} ok, {len(rep.bad)} bad, "
            f"{len(rep.orphans)} incomplete (interrupted publishes, never loaded)"
        )
        for b in rep.bad + rep.orphans:
            print(f"  {b['kind']:<16} {b['digest'][:16]}  {safe_text(b['problem'])}")
        if args.repair:
            print(f"quarantined/removed {rep.repaired}")
            for f in rep.repair_failed:
                print(f"  not repaired: {safe_text(f)}")
    if args.repair:
        return 1 if rep.repair_failed else 0
    return 0 if rep.clean else 1


def cmd_prune(args: argparse.Namespace) -> int:
    from ..maintenance import DAY, prune

    store = open_store(args)
    max_size = parse_size(args.max_size, setting="--max-size") if args.max_size else None
    older = parse_duration(args.older_than, setting="--older-than") if args.older_than else None
    if args.fingerprint not in (None, "stale"):
        raise ConfigError(f"--fingerprint: only 'stale' is supported, got {args.fingerprint!r}")
    stale_after = None
    if args.fingerprint == "stale":
        stale_after = parse_duration(args.stale_after, setting="--stale-after") if args.stale_after else DAY
    if max_size is None and older is None and stale_after is None:
        raise ConfigError("prune: give --max-size, --older-than and/or --fingerprint stale")
    rep = prune(store, max_size=max_size, older_than=older, stale_after=stale_after)
    store.counters.flush()
    remaining = list(store.layout.iter_entries())
    print(
        f"removed {len(rep.removed)} entries ({human(rep.freed_bytes)}); "
        f"{len(remaining)} remain ({human(sum(e.size for e in remaining))})"
    )
    return _report_unremoved(rep)


def _report_unremoved(rep: Any) -> int:
    if rep.skipped:
        print(f"skipped {len(rep.skipped)} entries whose key another process holds (compiling or publishing)")
    for ref, why in rep.failed:
        print(f"  could not remove {ref.kind} {ref.digest[:16]}: {safe_text(why)}")
    return 1 if rep.skipped or rep.failed else 0


def cmd_clear(args: argparse.Namespace) -> int:
    from ..maintenance import clear

    store = open_store(args)
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("clear: refusing to clear without a terminal to confirm; pass --yes")
        answer = input(f"Remove every entry{' and all counters' if args.all else ''} in {store.root}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    rep = clear(store, everything=args.all)
    print(f"removed {len(rep.removed)} entries from {store.root}")
    return _report_unremoved(rep)
