"""``fa4cache bundle export|import|show``: a store's kernels as one verified file (no torch,
cutlass, FA4 or Ray import). Format and checks: :mod:`fa4cache.store.bundle`."""

from __future__ import annotations

import argparse
import datetime
import logging
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import human, safe_text, settings_of

log = logging.getLogger(__name__)


def add_bundle_parser(sub: Any) -> None:
    s = sub.add_parser("bundle", help="export the store to one file, or import one (verified)")
    bsub = s.add_subparsers(dest="bundle_command", required=True)
    e = bsub.add_parser("export", help="write the store's kernels (current toolchain) to FILE")
    e.add_argument("file", metavar="FILE")
    e.add_argument(
        "--all", action="store_true", help="every toolchain in the store, not just the current one"
    )
    e.set_defaults(func=cmd_export)
    i = bsub.add_parser("import", help="verify every entry of FILE, then publish them into the store")
    i.add_argument("file", metavar="FILE")
    i.add_argument(
        "--verify",
        action="store_true",
        help="then compile the imported entries that record a spec again on this machine and "
        "quarantine any whose bytes differ (minutes per spec on the CPU)",
    )
    i.set_defaults(func=cmd_import)
    w = bsub.add_parser("show", help="verify FILE and say what it holds (writes nothing)")
    w.add_argument("file", metavar="FILE")
    w.set_defaults(func=cmd_show)


def _producer(p: dict[str, Any]) -> str:
    when = p.get("created")
    date = (
        datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        if isinstance(when, (int, float))
        else "?"
    )
    return safe_text(f"{p.get('user', '?')} (uid {p.get('uid', '?')}) on {p.get('host', '?')}, {date}")


def cmd_export(args: argparse.Namespace) -> int:
    from fa4cache.store.bundle import export_bundle
    from fa4cache.store.paths import Layout

    s = settings_of(args)
    if not s.cache_dir.exists():
        raise ConfigError(f"cache directory {s.cache_dir} does not exist (nothing cached yet?)")
    layout = Layout(s.cache_dir)
    if args.all:
        tcs = None
    else:
        current = layout.most_recent_toolchain()
        if current is None:
            raise ConfigError(f"no toolchain recorded in {s.cache_dir} (nothing cached yet?); try --all")
        tcs = [current]
    r = export_bundle(s.cache_dir, Path(args.file), toolchains=tcs)
    for why in r.skipped:
        log.warning("fa4cache bundle: skipped %s", why)
    print(
        f"exported {r.entries} entries of {len(r.toolchains)} toolchain(s) to {r.path}: "
        f"{human(r.bundle_bytes)} for {human(r.artifact_bytes)} of kernels ({r.ratio:.2f}x)"
    )
    return 1 if r.skipped else 0


def cmd_import(args: argparse.Namespace) -> int:
    from fa4cache.store.bundle import import_bundle
    from fa4cache.store.store import Store

    store = Store(settings_of(args))
    r = import_bundle(store, Path(args.file))
    busy = f", {r.busy} being compiled here (skipped)" if r.busy else ""
    print(
        f"imported {r.imported} of {r.entries} entries into {store.root} ({r.present} already there{busy}); "
        f"bundle made by {_producer(r.producer)}, toolchain(s) {', '.join(r.toolchains) or '-'}"
    )
    return _rebuild_imported(store, r.imported_refs) if args.verify else 0


def _rebuild_imported(store: Any, refs: tuple[Any, ...]) -> int:
    """Rebuild what was imported; quarantine what differs (the bundle's producer filed bytes
    that its keys do not compile to here)."""
    from fa4cache.adapters.rebuild import rebuild

    r = rebuild(store, only=set(refs))
    print(
        f"rebuilt the imported entries of {r.specs} spec(s): {len(r.identical)} identical, "
        f"{len(r.different)} DIFFERENT (quarantined), {len(r.not_rebuilt)} not rebuilt"
    )
    for ref in r.different:
        store.quarantine(ref, "bundle import --verify: differs from its rebuild")
        print(f"  {ref.kind:<16} {ref.digest[:16]}  differs from its rebuild: quarantined")
    for ref, why in r.not_rebuilt[:20]:
        print(f"  {ref.kind:<16} {ref.digest[:16]}  not rebuilt: {safe_text(why)}")
    return 1 if r.different else 0


def cmd_show(args: argparse.Namespace) -> int:
    from collections import Counter

    from fa4cache.store.bundle import show_bundle
    from fa4cache.store.secure_io import owners

    m = show_bundle(Path(args.file), owners(settings_of(args).trusted_uids))
    print(f"{args.file}: {len(m.entries)} entries, all verified; made by {_producer(m.producer)}")
    for tc, desc in m.toolchains.items():
        versions = (desc or {}).get("versions", {})
        fa4 = versions.get("flash-attn-4", "?") if isinstance(versions, dict) else "?"
        kinds = Counter(e.ref.kind for e in m.entries if e.ref.toolchain == tc)
        arch = (desc or {}).get("arch", "?")
        print(
            safe_text(f"  toolchain {tc}: flash-attn-4 {fa4}, sm_{arch}; ")
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        )
    return 0
