"""``fa4cache bundle export|import|show``: a store's kernels as one verified file (no torch,
cutlass, FA4 or Ray import). Format and checks: :mod:`fa4cache.store.bundle`."""

from __future__ import annotations

import argparse
import datetime
import logging
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import human, inspected_store_settings, plural, safe_text, settings_of, writable_store_settings

log = logging.getLogger(__name__)


def add_bundle_parser(sub: Any) -> None:
    s = sub.add_parser("bundle", help="export the store to one file, or import one (verified)")
    bsub = s.add_subparsers(dest="bundle_command", required=True)
    e = bsub.add_parser("export", help="write the store's kernels (every toolchain) to FILE")
    e.add_argument("file", metavar="FILE")
    e.add_argument(
        "--current",
        action="store_true",
        help="only the current toolchain (the most recently used one with kernels); "
        "what is left out is counted",
    )
    # Every toolchain is the default now; --all is kept so that scripts written for it still run.
    e.add_argument("--all", action="store_true", help=argparse.SUPPRESS)
    e.set_defaults(func=cmd_export)
    i = bsub.add_parser("import", help="verify every entry of FILE, then publish them into the store")
    i.add_argument("file", metavar="FILE")
    i.add_argument(
        "--verify",
        action="store_true",
        help="import only entries that compile again here to the same bytes: each is rebuilt from "
        "the spec it records (minutes per spec on the CPU) before anything is published; any entry "
        "that differs, or that cannot be rebuilt, refuses the whole bundle (exit 1)",
    )
    i.add_argument(
        "--keep-unverified",
        action="store_true",
        help="with --verify: also import the entries that cannot be rebuilt here (no spec, another "
        "toolchain), trusting their producer for those; entries that differ are still refused",
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
    from collections import Counter

    from fa4cache.store.bundle import export_bundle
    from fa4cache.store.paths import Layout

    s = inspected_store_settings(args)  # NoStoreYet, NotAStore: exit 2
    layout = Layout(s.cache_dir)
    held = Counter(e.ref.toolchain for e in layout.iter_entries())
    if not held:
        raise ConfigError(f"the store {s.cache_dir} holds no kernels yet: nothing to export")
    tcs = None
    if args.current and not args.all:
        current = layout.most_recent_toolchain()
        tcs = [current] if current is not None else []
    r = export_bundle(s.cache_dir, Path(args.file), toolchains=tcs)
    for why in r.skipped:
        log.warning("fa4cache bundle: skipped %s (failed verification; `fa4cache verify --repair`)", why)
    print(
        f"exported {r.entries} entries of {len(r.toolchains)} toolchain(s) to {r.path}: "
        f"{human(r.bundle_bytes)} for {human(r.artifact_bytes)} of kernels ({r.ratio:.2f}x)"
    )
    for line in _toolchain_lines(layout, r.toolchains):
        print(line)
    asked = set(held) if tcs is None else set(tcs)
    left = {tc: n for tc, n in held.items() if tc not in asked}
    if left:
        print(
            f"left out {plural(sum(left.values()), 'entry', 'entries')} of {plural(len(left), 'other toolchain')} "
            f"({', '.join(sorted(left))}): not the current one; drop --current to include them"
        )
    if r.skipped:
        print(f"left out {plural(len(r.skipped), 'entry', 'entries')} that failed verification (see above)")
    return 1 if r.skipped else 0


def _toolchain_lines(layout: Any, toolchains: tuple[str, ...]) -> list[str]:
    """One line per exported toolchain: what it targets and its kernels by kind."""
    from collections import Counter

    from fa4cache.store.bundle import _toolchain_description

    out = []
    for tc in toolchains:
        desc = _toolchain_description(layout, tc) or {}
        kinds = Counter(e.ref.kind for e in layout.iter_entries(toolchain=tc))
        arch = desc.get("arch", "?")
        out.append(
            safe_text(f"  toolchain {tc}: sm_{arch}; ")
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        )
    return out


def _bundle_path(file: str) -> Path:
    """FILE as given, refused before it is opened where it cannot be a bundle (the open
    would report a directory as ``Is a directory: 3``, a descriptor number)."""
    path = Path(file)
    if path.is_dir():
        raise ConfigError(
            f"{file} is a directory, not a bundle file (make one with `fa4cache bundle export FILE`)"
        )
    return path


def _read_only_message(e: Exception) -> ConfigError:
    """A bundle error as ``show`` says it: show writes nothing, so "nothing was imported" is
    not news (import's own message keeps it)."""
    return ConfigError(str(e).removesuffix("; nothing was imported") + " (bundle show writes nothing)")


def cmd_import(args: argparse.Namespace) -> int:
    from fa4cache.store.bundle import import_bundle
    from fa4cache.store.store import Store

    if args.keep_unverified and not args.verify:
        raise ConfigError("--keep-unverified only makes sense with --verify")
    settings = writable_store_settings(args)
    path = _bundle_path(args.file)
    if not settings.cache_dir.exists():
        # Opening the store creates it: a bundle that fails its checks (missing, empty,
        # truncated) must leave no empty store behind, so it is checked whole first.
        from fa4cache.store.bundle import show_bundle
        from fa4cache.store.secure_io import owners

        show_bundle(path, owners(settings.trusted_uids))
    store = Store(settings)
    if args.verify:
        return _import_rebuilt(args, store)
    r = import_bundle(store, path)
    busy = f", {r.busy} being compiled here (skipped)" if r.busy else ""
    print(
        f"imported {r.imported} of {r.entries} entries into {store.root} ({r.present} already there{busy}); "
        f"bundle made by {_producer(r.producer)}, toolchain(s) {', '.join(r.toolchains) or '-'}"
    )
    _print_fit(args)
    return 0


def _import_rebuilt(args: argparse.Namespace, store: Any) -> int:
    """``import --verify``: the bundle is imported into a scratch store, every entry the
    target store lacks is rebuilt from its recorded spec, and only then is what was rebuilt
    identical (plus, with ``--keep-unverified``, what could not be rebuilt) published into
    ``store``, from the scratch copies that were compared. Anything DIFFERENT, or anything
    not rebuilt without ``--keep-unverified``, refuses the whole bundle: nothing is published."""
    import tempfile

    from fa4cache.adapters.compile import rebuild
    from fa4cache.store.bundle import _toolchain_description, import_bundle, publish_entries
    from fa4cache.store.store import Store

    path = _bundle_path(args.file)
    with tempfile.TemporaryDirectory(prefix="fa4cache-import-") as tmp:
        scratch = Store.at(Path(tmp) / "store", base_dirs=(), remote_tier=None, distributed=False)
        r = import_bundle(scratch, path)  # the bundle's own checks, all of it first
        todo = {ref for ref in r.imported_refs if not store.has(ref)}
        rep = rebuild(scratch, only=todo)
        print(
            f"rebuilt {len(todo)} of the bundle's {r.entries} entries ({r.entries - len(todo)} already in "
            f"{store.root}) from {rep.specs} spec(s): {len(rep.identical)} identical, "
            f"{len(rep.different)} DIFFERENT, {len(rep.not_rebuilt)} not rebuilt"
        )
        for ref in rep.different:
            print(
                f"  {ref.kind:<16} {ref.digest[:16]}  differs from its rebuild: not what its key compiles to"
            )
        for ref, why in rep.not_rebuilt[:20]:
            print(f"  {ref.kind:<16} {ref.digest[:16]}  not rebuilt: {safe_text(why)}")
        if rep.different or (rep.not_rebuilt and not args.keep_unverified):
            n = len(rep.different) + (0 if args.keep_unverified else len(rep.not_rebuilt))
            hint = (
                ""
                if rep.different
                else "; --keep-unverified imports them anyway, trusting the bundle's producer for them"
            )
            print(
                f"refused the bundle: {plural(n, 'entry', 'entries')} not verified by a rebuild "
                f"({len(rep.different)} DIFFERENT, {len(rep.not_rebuilt)} not rebuilt); nothing was "
                f"imported into {store.root}{hint}"
            )
            return 1
        keep = sorted(set(rep.identical) | {ref for ref, _ in rep.not_rebuilt}, key=lambda x: x.digest)
        items = []
        for ref in keep:
            art = scratch.serve(ref)
            if art is None:
                raise ConfigError(f"the scratch copy of {ref.digest[:16]} vanished; nothing was imported")
            items.append((ref, art.data, art.sidecar))
        for tc in sorted({ref.toolchain for ref in keep}):
            desc = _toolchain_description(scratch.layout, tc)
            if desc is not None:
                store.record_toolchain(tc, desc)
        by = f"{r.producer.get('user', '?')}@{r.producer.get('host', '?')}"
        imported, present, busy = publish_entries(store, items, f"bundle {path} made by {by}, rebuilt"[:1024])
    unverified = len(rep.not_rebuilt)
    print(
        f"imported {len(imported)} of {r.entries} entries into {store.root} ({present} already there"
        + (f", {busy} being compiled here (skipped)" if busy else "")
        + (f", {unverified} NOT verified (--keep-unverified)" if unverified else "")
        + f"); bundle made by {_producer(r.producer)}, toolchain(s) {', '.join(r.toolchains) or '-'}"
    )
    _print_fit(args)
    return 0


def _print_fit(args: argparse.Namespace) -> None:
    """Which of the bundle's kernels can serve this host (fa4cache.cli.host_fit); its
    manifest only, read again (the entries were verified already)."""
    from collections import Counter

    from fa4cache.store.bundle import BundleError, open_bundle, read_manifest
    from fa4cache.store.secure_io import owners

    path = Path(args.file)
    try:
        from .host_fit import fit_lines
    except ImportError as e:  # a checkout on sys.path without its mapped packages: no verdict
        log.info("fa4cache: cannot tell which kernels serve this host: %s", e)
        return
    try:
        with open_bundle(path, owners(settings_of(args).trusted_uids)) as f:
            m = read_manifest(f, path)
    except (BundleError, OSError):
        return
    counts = Counter(e.ref.toolchain for e in m.entries)
    for line in fit_lines(dict(m.toolchains), counts, "the bundle"):
        print("  " + safe_text(line))


def cmd_show(args: argparse.Namespace) -> int:
    from collections import Counter

    from fa4cache.store.bundle import BundleError, show_bundle
    from fa4cache.store.secure_io import owners

    try:
        m = show_bundle(_bundle_path(args.file), owners(settings_of(args).trusted_uids))
    except BundleError as e:
        raise _read_only_message(e) from None
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
    _print_fit(args)
    return 0
