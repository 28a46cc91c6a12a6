"""``fa4cache``: inspect and maintain a kernel store from the shell.

Every command except ``warm`` and ``doctor`` works from files alone: no torch,
cutlass, FA4 or Ray import, so ``fa4cache stats`` answers in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError, Fa4CacheError
from .settings import Settings, parse_duration, parse_size

log = logging.getLogger(__name__)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    d = max(0.0, time.time() - ts)
    for unit, s in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= s:
            return f"{d / s:.0f}{unit} ago"
    return f"{d:.0f}s ago"


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(args.cache_dir)


def _store(args: argparse.Namespace) -> Any:
    from .store import Store

    s = _settings(args)
    if not s.cache_dir.exists():
        raise ConfigError(f"cache directory {s.cache_dir} does not exist (nothing cached yet?)")
    return Store(s)


def _safe(x: Any) -> str:
    """Text from a store file, fit for a terminal (no escape sequences)."""
    return "".join(c if c.isprintable() else "?" for c in str(x))


# --------------------------------------------------------------------------- stats


def cmd_stats(args: argparse.Namespace) -> int:
    from . import counters
    from .stats import collect

    s = _settings(args)
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
        ("Entries", f"{st['entries']}  ({_human(st['bytes'])})"),
        ("Hits", f"{st['hits']}  (memory {st['memory_hits']}, disk {st['disk_hits']})"),
        ("Misses", str(st["misses"])),
        ("Hit rate", rate),
        ("Compiles", f"{st['compiles']}  ({st['compile_seconds']:.1f} s spent)"),
        (
            "Compile time saved",
            f"{st['compile_seconds_saved']:.1f} s  (disk hits x mean compile time of their kind)",
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
                f"  {kind:<{kw}}{v.get('entries', 0):>8}{_human(v.get('bytes', 0)):>12}{int(v.get('compiles', 0)):>10}"
                f"{int(v.get('disk_hits', 0)):>11}{int(v.get('memory_hits', 0)):>10}"
                f"{('-' if mean is None else f'{mean:.2f} s'):>14}"
            )
    if st["by_toolchain"]:
        print("\nBy toolchain:")
        for tc, v in st["by_toolchain"].items():
            mark = "  (most recently used)" if v["current"] else ""
            print(f"  {tc}  {v['entries']:>6} entries  {_human(v['bytes']):>10}{mark}")
    if len(st["by_host"]) > 1:
        print("\nBy host:")
        for h, v in st["by_host"].items():
            print(
                f"  {_safe(h):<24} hits {int(v['memory_hits'] + v['disk_hits']):>8}  compiles {int(v['compiles']):>6}  ({v['compile_seconds']:.1f} s)"
            )
    return 0


# --------------------------------------------------------------------------- ls / verify / prune / clear


def cmd_ls(args: argparse.Namespace) -> int:
    store = _store(args)
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
            f"{r['kind'][:15]:<16}{r['digest'][:12]:<14}{_safe(s.get('dtype', '-'))[:9]:<10}{_safe(s.get('head_dim', '-'))[:5]:>5}  "
            f"{_safe(mask)[:13]:<14}{_human(r['size']):>10}{('-' if cs is None else f'{cs:.1f}s'):>9}  "
            f"{_ago(r['last_used']):<12}{r['hits']:>6}"
        )
    print(f"{len(rows)} entries")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .maintenance import verify

    store = _store(args)
    rep = verify(store, repair=args.repair)
    if args.json:
        print(json.dumps(rep.as_dict(), indent=2))
    else:
        print(
            f"checked {rep.checked} entries: {rep.ok} ok, {len(rep.bad)} bad, "
            f"{len(rep.orphans)} incomplete (interrupted publishes, never loaded)"
        )
        for b in rep.bad + rep.orphans:
            print(f"  {b['kind']:<16} {b['digest'][:16]}  {_safe(b['problem'])}")
        if args.repair:
            print(f"quarantined/removed {rep.repaired}")
            for f in rep.repair_failed:
                print(f"  not repaired: {_safe(f)}")
    if args.repair:
        return 1 if rep.repair_failed else 0
    return 0 if rep.clean else 1


def cmd_prune(args: argparse.Namespace) -> int:
    from .maintenance import DAY, prune

    store = _store(args)
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
        f"removed {len(rep.removed)} entries ({_human(rep.freed_bytes)}); "
        f"{len(remaining)} remain ({_human(sum(e.size for e in remaining))})"
    )
    return _report_unremoved(rep)


def _report_unremoved(rep: Any) -> int:
    if rep.skipped:
        print(f"skipped {len(rep.skipped)} entries whose key another process holds (compiling or publishing)")
    for ref, why in rep.failed:
        print(f"  could not remove {ref.kind} {ref.digest[:16]}: {_safe(why)}")
    return 1 if rep.skipped or rep.failed else 0


def cmd_clear(args: argparse.Namespace) -> int:
    from .maintenance import clear

    store = _store(args)
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


# --------------------------------------------------------------------------- warm


def _specs_from_flags(args: argparse.Namespace) -> list[Any]:
    from .spec import KernelSpec

    heads, _, hkv = (args.heads or "16").partition(":")
    try:
        h = int(heads)
        h_kv = int(hkv) if hkv else None
    except ValueError:
        raise ConfigError(f"--heads: expected N or N:M, got {args.heads!r}") from None
    masks = args.mask or ["document"]
    out = []
    for dtype in args.dtype or ["bf16"]:
        for hd in args.head_dim or [128]:
            for m in masks:
                mask = m
                if m == "document" and args.window:
                    mask = "document_window"
                if m == "document" and args.causal is False:
                    mask = "document_bidirectional"
                out.append(
                    KernelSpec(
                        dtype=dtype,
                        head_dim=hd,
                        heads=h,
                        heads_kv=h_kv,
                        mask=mask,
                        backward=args.backward,
                        seqlen=args.seqlen,
                        window=args.window or 256,
                        arch=args.arch,
                        varlen=args.varlen,
                    )
                )
    return out


def _replay_specs(args: argparse.Namespace) -> tuple[list[Any], int]:
    from .spec import KernelSpec

    # Every recorded spec, whatever its toolchain: what is already compiled for the
    # toolchain doing the warming shows as "present".
    store = _store(args)
    seen: dict[str, Any] = {}
    unreplayable = 0
    for e in store.layout.iter_entries():
        side = store.read_sidecar(e.ref)
        spec = side.spec if side else None
        if not isinstance(spec, dict):
            unreplayable += 1
            continue
        try:
            ks = KernelSpec.from_dict(spec)
        except ConfigError:
            unreplayable += 1
            continue
        seen[json.dumps(ks.to_dict(), sort_keys=True)] = ks
    return list(seen.values()), unreplayable


def _warm_worker(spec_dict: dict[str, Any], cache_dir: str | None) -> dict[str, Any]:
    import warnings

    # FA4 and the DSL warn about their own deprecations on every import; not the user's concern here.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*cannot be converted to a JitArgument.*")
    from .adapters.warm import warm
    from .spec import KernelSpec

    r = warm([KernelSpec.from_dict(spec_dict)], cache_dir)[0]
    return {"compiles": r.compiles, "present": r.present, "seconds": r.seconds, "error": r.error}


def cmd_warm(args: argparse.Namespace) -> int:
    from .spec import load_manifest

    unreplayable = 0
    if args.replay:
        specs, unreplayable = _replay_specs(args)
    elif args.manifest:
        specs = load_manifest(args.manifest)
    elif args.hf_config:
        from .model_config import load_config, specs_for

        specs = specs_for(
            load_config(args.hf_config), dtypes=args.dtype, backward=args.backward, arch=args.arch
        )
    else:
        specs = _specs_from_flags(args)
    if not specs:
        print(
            "nothing to warm"
            + (f" ({unreplayable} old entries carry no replayable spec)" if unreplayable else "")
        )
        return 0
    cache_dir = str(_settings(args).cache_dir)
    archs = sorted({s.arch.rstrip("a") for s in specs})
    if len(archs) > 1:
        # FA4 reads its target arch once, at import: one process compiles for one arch.
        raise ConfigError(f"warm: one target arch per run, got {', '.join(archs)}; run warm once per arch")
    from .adapters.warm import set_cross_compile_env

    set_cross_compile_env(specs[0].arch)
    results: list[tuple[Any, dict[str, Any]]] = []
    t0 = time.perf_counter()
    progress = sys.stderr.isatty() and not args.quiet

    def report(i: int, spec: Any, r: dict[str, Any]) -> None:
        if progress:
            done = int(30 * i / len(specs))
            sys.stderr.write(f"\r[{'#' * done}{'.' * (30 - done)}] {i}/{len(specs)} {spec.label()[:40]:<40}")
            sys.stderr.flush()

    if args.jobs > 1 and len(specs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as ex:
            futs = {ex.submit(_warm_worker, s.to_dict(), cache_dir): s for s in specs}
            for i, f in enumerate(as_completed(futs), 1):
                s = futs[f]
                try:
                    r = f.result()
                except Exception as e:
                    r = {"compiles": 0, "present": 0, "seconds": 0.0, "error": f"{type(e).__name__}: {e}"}
                results.append((s, r))
                report(i, s, r)
    else:
        for i, s in enumerate(specs, 1):
            r = _warm_worker(s.to_dict(), cache_dir)
            results.append((s, r))
            report(i, s, r)
    if progress:
        sys.stderr.write("\n")
    print(f"{'spec':<44}{'compiled':>9}{'present':>9}{'seconds':>9}  status")
    failed = 0
    for s, r in results:
        status = "ok" if r["error"] is None else f"FAILED: {r['error'][:80]}"
        failed += r["error"] is not None
        print(f"{s.label():<44}{r['compiles']:>9}{r['present']:>9}{r['seconds']:>9.1f}  {status}")
    total = sum(r["compiles"] for _, r in results)
    print(
        f"{len(results)} specs, {total} kernels compiled, {failed} failed, {time.perf_counter() - t0:.1f} s"
    )
    if unreplayable:
        print(f"{unreplayable} entries carry no spec (compiled by training calls) and were not replayed")
    return 1 if failed else 0


# --------------------------------------------------------------------------- env / doctor


def cmd_env(args: argparse.Namespace) -> int:
    s = _settings(args)
    env = s.job_env()
    for k in sorted(env):
        if args.shell:
            import shlex

            print(f"export {k}={shlex.quote(env[k])}")
        else:
            print(f"{k}={env[k]}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from importlib import metadata

    from .fingerprint import DISTRIBUTIONS, toolchain
    from .fsinfo import NETWORK_FS, lock_works, mount_for

    problems = 0

    def line(status: str, what: str, detail: str) -> None:
        nonlocal problems
        problems += status == "FAIL"
        print(f"[{status:^4}] {what:<22} {detail}")

    for d in DISTRIBUTIONS:
        try:
            line("ok", d, metadata.version(d))
        except metadata.PackageNotFoundError:
            status = "FAIL" if d in ("flash-attn-4", "nvidia-cutlass-dsl", "torch") else "info"
            if d.startswith("nvidia-cutlass-dsl-libs-cu"):
                status = "info"
            line(status, d, "not installed")
    try:
        import torch

        if torch.cuda.is_available():
            cap = torch.cuda.get_device_capability()
            line(
                "ok",
                "GPU",
                f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}), {torch.cuda.device_count()} device(s)",
            )
        else:
            line("info", "GPU", "none: kernels can still be cross-compiled (fa4cache warm)")
    except Exception as e:
        line("info", "GPU", f"unknown ({type(e).__name__}: {e})")
    s = _settings(args)
    line("ok", "cache directory", str(s.cache_dir))
    from .layout import Layout

    recent = Layout(s.cache_dir).most_recent_toolchain()
    line(
        "info",
        "toolchain (store)",
        f"{recent or 'none recorded yet'}: the most recently used, recorded by jobs",
    )
    line(
        "info",
        "toolchain (shell)",
        f"{toolchain().id}: computed in this shell's environment, without FA4's patches",
    )
    from .settings import setting

    masking = "on" if setting("FA4CACHE_INTERVAL_MASKING") else "off (FA4CACHE_INTERVAL_MASKING=0)"
    line(
        "info",
        "interval masking",
        f"{masking}; patches FA4's Hopper (sm_90) kernels only, other archs unchanged",
    )
    root = s.cache_dir if s.cache_dir.exists() else s.cache_dir.parent
    mnt, fstype = mount_for(root)
    line("warn" if fstype in NETWORK_FS else "ok", "filesystem", f"{fstype} at {mnt}")
    if s.cache_dir.exists():
        import stat as _stat

        st = os.lstat(s.cache_dir)
        mode = _stat.S_IMODE(st.st_mode)
        own = hasattr(os, "getuid") and st.st_uid == os.getuid()
        line(
            "ok" if own and not mode & 0o022 else "FAIL",
            "permissions",
            f"mode {mode:o}, {'owned by you' if own else f'owner uid {st.st_uid}'}",
        )
        ok, detail = lock_works(s.cache_dir)
        line("ok" if ok else "FAIL", "file locks", detail)
    else:
        line("info", "permissions", "directory not created yet")
    import shutil

    try:
        du = shutil.disk_usage(root)
        line("ok" if du.free > 1 << 30 else "warn", "free space", _human(du.free))
    except OSError as e:
        line("warn", "free space", str(e))
    if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1":
        line(
            "warn",
            "FA4 own cache",
            "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1: fa4cache replaces it; unset it to avoid storing kernels twice",
        )
    else:
        line("ok", "FA4 own cache", "off (fa4cache handles persistence)")
    return 1 if problems else 0


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fa4cache", description="FlashAttention-4 kernel cache")
    p.add_argument("--cache-dir", help="store directory (default: $FA4CACHE_DIR or ~/.cache/fa4cache)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("stats", help="entries, hits, misses, compile time spent and saved")
    s.add_argument("--json", action="store_true")
    s.add_argument("--zero", action="store_true", help="reset the counters (entries are kept)")
    s.set_defaults(func=cmd_stats)

    s = sub.add_parser("ls", help="one line per entry")
    s.add_argument("--kind")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser("verify", help="check every entry's checksum and sidecar")
    s.add_argument("--repair", action="store_true", help="quarantine bad entries")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("prune", help="evict entries (LRU, age, stale toolchains)")
    s.add_argument("--max-size")
    s.add_argument("--older-than")
    s.add_argument(
        "--fingerprint", help="'stale': entries of toolchains no process has used for --stale-after"
    )
    s.add_argument("--stale-after", help="with --fingerprint stale: unused for this long (default 1d)")
    s.set_defaults(func=cmd_prune)

    s = sub.add_parser("clear", help="remove every entry")
    s.add_argument("--all", action="store_true", help="also counters and quarantine")
    s.add_argument("--yes", action="store_true")
    s.set_defaults(func=cmd_clear)

    s = sub.add_parser("warm", help="compile kernel sets ahead of time, without a GPU")
    s.add_argument("--dtype", action="append", choices=["bf16", "fp16"])
    s.add_argument("--head-dim", action="append", type=int)
    s.add_argument("--heads", help="query heads, or Q:KV for GQA (default 16)")
    s.add_argument("--mask", action="append", help="none, causal, document, draft_block, ... (repeatable)")
    s.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    s.add_argument("--window", type=int)
    s.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True)
    s.add_argument("--seqlen", type=int, default=1024)
    s.add_argument(
        "--varlen", action="store_true", help="document masks: the kernels fa4cache.attention runs"
    )
    s.add_argument("--arch", default="sm_90")
    s.add_argument("--manifest", help="JSON list of specs")
    s.add_argument(
        "--hf-config",
        metavar="PATH",
        help="a transformers model's config.json (or its directory): the kernels its "
        'attn_implementation="fa4cache" runs',
    )
    s.add_argument(
        "--replay",
        action="store_true",
        help="compile every spec recorded in the store (e.g. after an upgrade)",
    )
    s.add_argument("-j", "--jobs", type=int, default=1)
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(func=cmd_warm)

    s = sub.add_parser("env", help="environment to export for a job")
    s.add_argument("--shell", action="store_true")
    s.set_defaults(func=cmd_env)

    s = sub.add_parser("doctor", help="check versions, GPU, directory, filesystem, locks")
    s.set_defaults(func=cmd_doctor)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `fa4cache stats | head`: the reader left; not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (Fa4CacheError, OSError, ValueError) as e:
        print(f"fa4cache {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
