"""Why a miss missed: the nearest stored key of the same kind, and which of its fields differ.

The "shipped a bundle, never hit" complaint: a store (or base, or imported bundle) full of
kernels that a job never loads, because one key field or the toolchain differs. Sidecars hold
each entry's key as JSON; on a miss the key asked for is compared with the stored keys of
its kind, and the differences of the closest one are logged. A warning when this is the
process's first lookup of that kind and it missed (a node whose shipped kernels do not fit);
at INFO level otherwise (a new shape in a running job is no news).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fa4cache.errors import InsecurePath

from .paths import LAYOUT, TOOLCHAIN_FILE, EntryRef, is_digest
from .secure_io import only_me, read_checked
from .sidecar import MAX_SIDECAR_BYTES, Sidecar

log = logging.getLogger(__name__)

MAX_SCAN = 2000  # sidecars read per miss at most (a miss is followed by a compile of seconds)
MAX_FIELDS = 6
_seen_kinds: set[str] = set()  # kinds that missed (or hit) in this process already


def flat(x: Any, path: str = "") -> dict[str, Any]:
    """Leaves of a JSON value by path (``[3]``, ``.versions.torch``)."""
    if isinstance(x, list):
        out: dict[str, Any] = {f"{path}#len": len(x)}
        for i, v in enumerate(x):
            out.update(flat(v, f"{path}[{i}]"))
        return out
    if isinstance(x, dict):
        out = {}
        for k, v in sorted(x.items()):
            out.update(flat(v, f"{path}.{k}" if path else str(k)))
        return out
    return {path: x}


def diff(a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """Fields where JSON values ``a`` (asked for) and ``b`` (stored) differ: (path, a, b)."""
    fa, fb = flat(a), flat(b)
    return [(p, fa.get(p), fb.get(p)) for p in sorted(set(fa) | set(fb)) if fa.get(p) != fb.get(p)]


def _dirs(store: Any) -> Iterator[tuple[str, Path, frozenset[int]]]:
    yield "this store", store.root, only_me()
    for b in store.bases:
        yield f"base {b}", b, store._base_trust


def _stored_keys(store: Any, kind: str) -> Iterator[tuple[str, Path, frozenset[int], str, str]]:
    """(where, root, its trust, toolchain, key text) of stored entries of ``kind``, at most MAX_SCAN."""
    n = 0
    for where, root, trusted in _dirs(store):
        try:
            tcs = sorted(os.listdir(root / LAYOUT))
        except OSError:
            continue
        for tc in tcs:
            kdir = root / LAYOUT / tc / kind
            try:
                names = os.listdir(kdir)
            except OSError:
                continue
            for name in names:
                if not name.endswith(".json") or not is_digest(name[:-5]):
                    continue
                if n >= MAX_SCAN:
                    return
                n += 1
                try:
                    ref = EntryRef(tc, kind, name[:-5])
                    side = Sidecar.parse(
                        read_checked(kdir / name, max_bytes=MAX_SIDECAR_BYTES, trusted=trusted), ref
                    )
                except (OSError, ValueError, InsecurePath):
                    continue
                if side is not None and side.key:
                    yield where, root, trusted, tc, side.key


def _toolchain(root: Path, tc: str, trusted: frozenset[int]) -> dict[str, Any]:
    try:
        obj = json.loads(
            read_checked(root / LAYOUT / tc / TOOLCHAIN_FILE, max_bytes=1 << 16, trusted=trusted)
        )
    except (OSError, ValueError, InsecurePath):
        return {}
    return obj if isinstance(obj, dict) else {}


def _fmt(fields: list[tuple[str, Any, Any]]) -> str:
    shown = ", ".join(f"{p or 'key'}: {a!r} here, {b!r} stored" for p, a, b in fields[:MAX_FIELDS])
    return shown + (f" and {len(fields) - MAX_FIELDS} more" if len(fields) > MAX_FIELDS else "")


def explain(store: Any, ref: EntryRef, encoded: str) -> str | None:
    """One line on the stored key of ``ref.kind`` closest to ``encoded``, or None."""
    try:
        want = json.loads(encoded)
    except ValueError:
        return None
    best: tuple[tuple[int, int], str, Path, frozenset[int], str, list[tuple[str, Any, Any]]] | None = None
    for where, root, trusted, tc, key in _stored_keys(store, ref.kind):
        try:
            fields = [] if key == encoded else diff(want, json.loads(key))
        except ValueError:
            continue
        rank = (len(fields), int(tc != ref.toolchain))
        if best is None or rank < best[0]:
            best = (rank, where, root, trusted, tc, fields)
        if rank == (0, 1):
            break
    if best is None:
        return None
    _, where, root, trusted, tc, fields = best
    if tc != ref.toolchain:
        tdiff = diff(_toolchain(store.root, ref.toolchain, only_me()), _toolchain(root, tc, trusted))
        tdesc = _fmt([d for d in tdiff if d[0] not in ("id",)]) or "their descriptions are not recorded"
        head = f"toolchain {tc} in {where}, this process compiles for {ref.toolchain} ({tdesc})"
        if not fields:
            return f"{ref.kind} miss: the same key is stored for another {head}"
        return f"{ref.kind} miss: the closest stored key is of another {head}, and differs in {_fmt(fields)}"
    return f"{ref.kind} miss: the closest stored key (in {where}) differs in {_fmt(fields)}"


def report(store: Any, ref: EntryRef, encoded: str) -> None:
    """Log :func:`explain` for a miss (see the module docstring). Never raises: it runs on
    the compile path."""
    first = ref.kind not in _seen_kinds and not store.counters.by_kind.get(ref.kind, {}).get("disk_hits")
    _seen_kinds.add(ref.kind)
    try:
        why = explain(store, ref, encoded)
    except Exception as e:  # a diagnostic must never cost the compile
        log.debug("fa4cache: could not explain a miss: %s", e)
        return
    if why is not None:
        log.log(logging.WARNING if first else logging.INFO, "fa4cache: %s", why)
