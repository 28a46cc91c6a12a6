"""``fa4cache stats``, ``ls``, ``verify``, ``prune`` and ``clear``: the store, from its files
alone (no torch, cutlass, FA4 or Ray import)."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from ..cache_dir import cache_dir_problem
from ..errors import ConfigError
from ..settings import parse_duration, parse_size
from .common import (
    NoStoreYet,
    ago,
    confirm,
    human,
    inspected_store_settings,
    no_store_line,
    open_store,
    plural,
    safe_text,
    settings_of,
    writable_store_settings,
)

log = logging.getLogger(__name__)


def cmd_stats(args: argparse.Namespace) -> int:
    from fa4cache.store import counters
    from fa4cache.store.stats import collect

    if args.zero:
        return _zero(args)
    try:
        s = inspected_store_settings(args)
    except NoStoreYet as e:  # no store yet: zeros for a script, the same line as ls for a person
        if not args.json:
            print(no_store_line(e))
            return 0
        s = e.settings
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
        (
            "Hits rebuilt",
            f"{st['verified_hits']}  ({st['verify_mismatches']} differed: quarantined; FA4CACHE_VERIFY_HITS)",
        ),
        (
            "Temp files",
            f"{st['temp_files']} ({human(st['temp_bytes'])}; publishes in progress or killed writers')",
        ),
        ("Refused (insecure)", str(st["insecure"])),
        ("Publish errors", str(st["publish_errors"])),
        (
            "Lock waits",
            f"{st['lock_waits']}  ({st['lock_wait_seconds']:.1f} s, {st['lock_timeouts']} timed out)",
        ),
        ("Evictions", str(st["evictions"])),
        (
            "Cluster",
            f"{st['remote_hits']} fetched ({st['remote_seconds']:.2f} s), {st['served']} served to other nodes, "
            f"{st['split_compiles']} compiled as this node's share of a split kernel set",
        ),
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
            mark = "  (current: the most recently used one with kernels)" if v["current"] else ""
            print(f"  {tc}  {v['entries']:>6} entries  {human(v['bytes']):>10}{mark}")
    if len(st["by_host"]) > 1:
        print("\nBy host:")
        for h, v in st["by_host"].items():
            print(
                f"  {safe_text(h):<24} hits {int(v['memory_hits'] + v['disk_hits']):>8}  compiles {int(v['compiles']):>6}  ({v['compile_seconds']:.1f} s)"
            )
    return 0


def _zero(args: argparse.Namespace) -> int:
    from fa4cache.store import counters

    try:
        inspected_store_settings(args)  # the store the workers use, checked from / down
    except NoStoreYet as e:
        if args.json:
            print(json.dumps({"cache_dir": str(e.settings.cache_dir), "zeroed": False}))
        else:
            print(f"{no_store_line(e)}: no counters to zero")
        return 0
    # A store this user cannot write is refused up front with the setting and the fix, as
    # prune and clear do (not a raw Errno 13).
    s = writable_store_settings(args)
    stats_dir = s.cache_dir / "stats"
    problem = cache_dir_problem(stats_dir) if stats_dir.exists() else None
    if problem is not None:
        raise ConfigError(f"cannot zero the counters: {stats_dir} {problem}")
    try:
        counters.zero(stats_dir)
    except PermissionError as e:
        raise ConfigError(
            f"cannot zero the counters: {stats_dir} is not writable by you ({e.strerror})"
        ) from None
    if args.json:
        print(json.dumps({"cache_dir": str(s.cache_dir), "zeroed": True}))
    else:
        print(f"counters zeroed for {s.cache_dir}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    try:
        store = open_store(args)
    except NoStoreYet as e:
        if args.kind is not None:
            raise ConfigError(
                f"--kind: no entries of kind {args.kind!r}; the store holds no entries yet"
            ) from None
        print("[]" if args.json else no_store_line(e))
        return 0
    if args.kind is not None:
        kinds = store.kinds()
        if args.kind not in kinds:
            held = f"kinds in this store: {', '.join(kinds)}" if kinds else "the store holds no entries yet"
            raise ConfigError(f"--kind: no entries of kind {args.kind!r}; {held}")
    rows = []
    for e in store.entries(kind=args.kind):
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
    for r in rows:
        r["summary"] = display_summary(r["summary"])
        r["spec"] = relevant_fields(r["spec"])
        # The mask as the table shows it, in JSON too (the sidecar's summary may hold none).
        label = mask_label(r["spec"], r["summary"])
        r["summary"]["mask"] = None if label == "-" else label
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [
        (
            r["kind"],
            r["digest"][:12],
            safe_text(r["summary"].get("dtype", "-")),
            safe_text(r["summary"].get("head_dim", "-")),
            safe_text(mask_label(r["spec"], r["summary"])),
            human(r["size"]),
            "-" if r["compile_seconds"] is None else f"{r['compile_seconds']:.1f}s",
            ago(r["last_used"]),
            str(r["hits"]),
        )
        for r in rows
    ]
    # Per entry, the jobs' loads of it from the store: what stats counts as disk hits
    # (stats' "Hits" adds memory hits, and stats --zero resets its counters, not these).
    head = ("kind", "digest", "dtype", "hdim", "mask", "size", "compile", "last used", "disk hits")
    right = {3, 5, 6, 8}  # numbers
    widths = [max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(head)]
    for line in (head, *table):
        print(
            "  ".join(
                c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))
            ).rstrip()
        )
    print(plural(len(rows), "entry"))
    return 0


def display_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A sidecar's summary with the dtype as warm and KernelSpec spell it (``bf16``; older
    stores recorded CuTe's ``BFloat16``)."""
    from fa4cache.store.sidecar import short_dtype

    out = dict(summary or {})
    if isinstance(out.get("dtype"), str):
        out["dtype"] = short_dtype(out["dtype"])
    return out


def relevant_fields(spec: Any) -> Any:
    from fa4cache.aot.spec import relevant_fields as fields_of

    return fields_of(spec) if isinstance(spec, dict) else spec


def mask_label(spec: Any, summary: dict[str, Any]) -> str:
    """The mask as warm names it, with what selects another kernel (window, softcap, varlen);
    entries compiled by training calls carry no spec: their mask's hash prefix."""
    if not isinstance(spec, dict):
        return str(summary.get("mask") or "-")
    gen = spec.get("generation")
    if isinstance(gen, dict):  # a kernel of `warm --generation`'s decode calls
        return "generation" + (f"({gen['window']})" if isinstance(gen.get("window"), int) else "")
    mask = str(spec.get("mask", "-"))
    if "window" in spec:
        mask += f"({spec['window']})"
    if spec.get("softcap"):
        mask += f" softcap{spec['softcap']:g}" if isinstance(spec["softcap"], (int, float)) else ""
    if spec.get("varlen"):
        mask += " varlen"
    return mask


def cmd_verify(args: argparse.Namespace) -> int:
    from fa4cache.store.maintenance import VerifyReport, verify

    try:
        store = open_store(args)
    except NoStoreYet as e:
        print(json.dumps(VerifyReport().as_dict(), indent=2) if args.json else f"{no_store_line(e)} to check")
        return 0
    rep = verify(store, repair=args.repair)
    rebuilt = _rebuild(store, args)
    if args.json:
        print(
            json.dumps({**rep.as_dict(), **({"rebuild": rebuilt} if rebuilt is not None else {})}, indent=2)
        )
    else:
        print(
            f"checked {rep.checked} entries: {rep.ok} ok, {len(rep.bad)} bad, "
            f"{len(rep.orphans)} incomplete (interrupted publishes, never loaded)"
        )
        kw = max((len(b["kind"]) for b in rep.bad + rep.orphans), default=0)
        for b in rep.bad + rep.orphans:
            print(f"  {b['kind']:<{kw}}  {b['digest'][:16]}  {safe_text(b['problem'])}")
        if args.repair:
            print(f"quarantined/removed {rep.repaired}")
            for f in rep.repair_failed:
                print(f"  not repaired: {safe_text(f)}")
    nothing = _nothing_rebuilt(rebuilt)
    if rebuilt is not None and not args.json:
        _print_rebuild(rebuilt)
        if nothing:
            print(f"nothing was rebuilt, so no entry was verified: {nothing}")
    # "Verified" means rebuilt: a full check (--rebuild without N) fails on entries it could
    # not rebuild as on entries that differ; a sample (--rebuild N) judges what it rebuilt,
    # and a sample that rebuilt nothing verified nothing: it fails too.
    full = args.rebuild == 0
    rebuilt_clean = rebuilt is None or not (
        rebuilt["different"] or (full and rebuilt["not_rebuilt"]) or nothing
    )
    if args.repair:
        return 1 if rep.repair_failed or not rebuilt_clean else 0
    return 0 if rep.clean and rebuilt_clean else 1


def _nothing_rebuilt(r: dict[str, Any] | None) -> str | None:
    """Why ``verify --rebuild`` compared no entry, in words, or None if it compared some."""
    if r is None or r["identical"] or r["different"]:
        return None
    if not r["not_rebuilt"]:
        return "the store holds no entries"
    if not r["specs"]:
        return "no entry records a spec (only the entries `fa4cache warm` made can be rebuilt)"
    return "none of the chosen specs' entries could be rebuilt here (the reasons above)"


def _rebuild(store: Any, args: argparse.Namespace) -> dict[str, Any] | None:
    if args.rebuild is None:
        return None
    from fa4cache.adapters.compile import rebuild

    r = rebuild(store, sample=args.rebuild or None)
    row = lambda ref: {"kind": ref.kind, "digest": ref.digest, "toolchain": ref.toolchain}  # noqa: E731
    return {
        "specs": r.specs,
        "identical": [row(x) for x in r.identical],
        "different": [row(x) for x in r.different],
        "not_rebuilt": [{**row(x), "why": why} for x, why in r.not_rebuilt],
    }


def _print_rebuild(r: dict[str, Any]) -> None:
    print(
        f"rebuilt the entries of {plural(r['specs'], 'spec')}: {len(r['identical'])} identical, "
        f"{len(r['different'])} DIFFERENT, {len(r['not_rebuilt'])} not rebuilt"
    )
    kw = max((len(e["kind"]) for e in r["different"] + r["not_rebuilt"][:20]), default=0)
    for e in r["different"]:
        print(
            f"  {e['kind']:<{kw}}  {e['digest'][:16]}  differs from its rebuild: not what its key compiles to"
        )
    for e in r["not_rebuilt"][:20]:
        print(f"  {e['kind']:<{kw}}  {e['digest'][:16]}  not rebuilt: {safe_text(e['why'])}")


def cmd_prune(args: argparse.Namespace) -> int:
    from fa4cache.store.maintenance import DAY, apply_prune, dry_run_report, plan_prune

    # Units are required: `--older-than 30` read as seconds, or `--max-size 2` as bytes,
    # empties a store.
    max_size = parse_size(args.max_size, setting="--max-size", unit_required=True) if args.max_size else None
    older = parse_duration(args.older_than, setting="--older-than") if args.older_than else None
    if args.fingerprint not in (None, "stale"):
        raise ConfigError(f"--fingerprint: only 'stale' is supported, got {args.fingerprint!r}")
    stale_after = None
    if args.fingerprint == "stale":
        stale_after = parse_duration(args.stale_after, setting="--stale-after") if args.stale_after else DAY
    elif args.stale_after:
        raise ConfigError("--stale-after: only with --fingerprint stale")
    if max_size is None and older is None and stale_after is None:
        raise ConfigError("give --max-size, --older-than and/or --fingerprint stale")
    try:
        store = _open_for_removal(args)
    except NoStoreYet as e:
        return _nothing_to_remove(args, e)
    plan = plan_prune(store, max_size=max_size, older_than=older, stale_after=stale_after)
    if args.dry_run:
        return _report_dry_run(dry_run_report(store, plan), store, args)
    if plan.removes_most():
        what = (
            f"{plural(len(plan.entries), 'entry')} ({human(plan.bytes)}) of the "
            f"{plural(plan.total_entries, 'entry')} ({human(plan.total_bytes)}) in {store.root}"
        )
        if not confirm(args, what, "most of the store"):
            print("nothing removed (not confirmed)")
            return 1  # declined, as apt-get's abort: the removal asked for did not happen
    rep = apply_prune(store, plan)
    store.counters.flush()
    if args.json:
        return _report_json(rep, store, dry_run=False)
    remaining = list(store.entries())
    print(
        f"removed {plural(len(rep.removed), 'entry')} ({human(rep.freed_bytes)}); "
        f"{len(remaining)} remain ({human(sum(e.size for e in remaining))})"
    )
    if rep.removed_toolchains:
        print(
            f"removed {plural(len(rep.removed_toolchains), 'empty toolchain directory', 'empty toolchain directories')}"
        )
    if rep.temp_files:
        print(f"removed {plural(rep.temp_files, 'temp file')} of killed writers")
    return _report_unremoved(rep)


def _open_for_removal(args: argparse.Namespace) -> Any:
    """The store, for prune and clear: one they cannot change is an error up front (exit 2),
    not a run that reports every removal as failed. Raises :class:`NoStoreYet`."""
    from fa4cache.store.store import Store

    if args.dry_run:
        return open_store(args)
    s = inspected_store_settings(args)  # NoStoreYet: nothing to remove
    return Store(writable_store_settings(args).with_cache_dir(s.cache_dir))


def _nothing_to_remove(args: argparse.Namespace, e: NoStoreYet) -> int:
    if args.json:
        print(json.dumps({"cache_dir": str(e.settings.cache_dir), "dry_run": args.dry_run, "removed": []}))
    else:
        print(f"{no_store_line(e)}: nothing to remove")
    return 0


def _report_json(rep: Any, store: Any, *, dry_run: bool) -> int:
    """``--json``: what was (``dry_run``: would be) removed and what remains, for a script."""
    gone = {e.ref for e in rep.removed}
    remaining = [e for e in store.entries() if e.ref not in gone]
    ref = lambda r: {"kind": r.kind, "digest": r.digest, "toolchain": r.toolchain}  # noqa: E731
    out = {
        "cache_dir": str(store.root),
        "dry_run": dry_run,
        "removed": [{**ref(e.ref), "size": e.size} for e in rep.removed],
        "removed_bytes": rep.freed_bytes,
        "removed_toolchains": list(rep.removed_toolchains),
        "temp_files": rep.temp_files,
        "remaining": len(remaining),
        "remaining_bytes": sum(e.size for e in remaining),
        "skipped": [ref(r) for r in rep.skipped],
        "failed": [{**ref(r), "why": why} for r, why in rep.failed],
    }
    print(json.dumps(out, indent=2))
    return 0 if dry_run else (1 if rep.skipped or rep.failed else 0)


def _report_dry_run(rep: Any, store: Any, args: argparse.Namespace) -> int:
    if args.json:
        return _report_json(rep, store, dry_run=True)
    kw = max((len(e.ref.kind) for e in rep.removed), default=0)  # one column, however long the kinds
    for e in rep.removed:
        print(
            f"would remove {e.ref.kind:<{kw}}  {e.ref.digest[:16]}  {human(e.size):>10}  toolchain {e.ref.toolchain}"
        )
    for tc in rep.removed_toolchains:
        print(f"would remove empty toolchain directory {tc}")
    if rep.temp_files:
        print(f"would remove {plural(rep.temp_files, 'temp file')} of killed writers")
    remaining = [e for e in store.entries() if e.ref not in {r.ref for r in rep.removed}]
    print(
        f"dry run: would remove {plural(len(rep.removed), 'entry')} ({human(rep.freed_bytes)}); "
        f"{len(remaining)} would remain ({human(sum(e.size for e in remaining))})"
    )
    return 0


def _report_unremoved(rep: Any) -> int:
    if rep.skipped:
        print(
            f"skipped {plural(len(rep.skipped), 'entry')} whose key another process holds (compiling or publishing)"
        )
    for ref, why in rep.failed:
        print(f"  could not remove {ref.kind} {ref.digest[:16]}: {safe_text(why)}")
    return 1 if rep.skipped or rep.failed else 0


def cmd_clear(args: argparse.Namespace) -> int:
    from fa4cache.store.maintenance import clear

    asked = settings_of(args).cache_dir
    try:
        store = _open_for_removal(args)
    except NoStoreYet as e:
        return _nothing_to_remove(args, e)
    if args.dry_run:
        return _report_dry_run(clear(store, everything=args.all, dry_run=True), store, args)
    what = f"every entry{' and all counters' if args.all else ''} in {store.root}"
    if store.root != asked:  # a squatted node-local path: the store the workers use instead
        what += f" (the store used instead of {asked}, which is not safe to use)"
    if not confirm(args, what):
        print("nothing removed (not confirmed)")
        return 1
    if args.json:
        return _report_json(clear(store, everything=args.all), store, dry_run=False)
    print(f"removing {what}")
    rep = clear(store, everything=args.all)
    print(f"removed {plural(len(rep.removed), 'entry')} from {store.root}")
    return _report_unremoved(rep)
