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
import re
from collections.abc import Iterator, Sequence
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


def toolchain_description(root: Path, tc: str, trusted: frozenset[int]) -> dict[str, Any]:
    """The recorded description (toolchain.json) of toolchain ``tc`` in the store at ``root``; {} if unreadable."""
    try:
        obj = json.loads(
            read_checked(root / LAYOUT / tc / TOOLCHAIN_FILE, max_bytes=1 << 16, trusted=trusted)
        )
    except (OSError, ValueError, InsecurePath):
        return {}
    return obj if isinstance(obj, dict) else {}


_ENCODING_SUFFIXES = (".i", ".f", ".type", ".enum", ".dtype", ".device", ".nt")


def _field(path: str, names: Sequence[str] | None) -> str:
    """A diff path in words: ``[10]`` -> ``mask_mod_hash`` (FA4's own name for it)."""
    for suffix in _ENCODING_SUFFIXES:
        if path.endswith(suffix) or path == suffix[1:]:
            path = path[: -len(suffix)] if path.endswith(suffix) else ""
            break
    if path == "#len":
        return "the number of key fields"
    m = re.match(r"\[(\d+)\](.*)", path)
    if m and names is not None and int(m.group(1)) < len(names):
        return names[int(m.group(1))] + m.group(2)
    return path or "key"


def _fmt(
    fields: list[tuple[str, Any, Any]], where: str = "the store", names: Sequence[str] | None = None
) -> str:
    shown = "; ".join(f"{_field(p, names)}: {a!r} here, {b!r} in {where}" for p, a, b in fields[:MAX_FIELDS])
    return shown + (f" and {len(fields) - MAX_FIELDS} more" if len(fields) > MAX_FIELDS else "")


def explain(store: Any, ref: EntryRef, encoded: str, names: Sequence[str] | None = None) -> str | None:
    """One line on the stored key of ``ref.kind`` closest to ``encoded``, or None; ``names``:
    the key's field names (FA4's, from its source), so the line says which field differs."""
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
    hint = _hint(fields, names)
    if tc != ref.toolchain:
        tdiff = diff(
            toolchain_description(store.root, ref.toolchain, only_me()),
            toolchain_description(root, tc, trusted),
        )
        tdesc = (
            _fmt([d for d in tdiff if d[0] not in ("id",)], where) or "their descriptions are not recorded"
        )
        head = f"another toolchain ({tdesc})"
        if not fields:
            return f"{ref.kind} miss: the same key is stored in {where} for {head}"
        return f"{ref.kind} miss: the closest key in {where} is for {head}, and differs in {_fmt(fields, where, names)}{hint}"
    return f"{ref.kind} miss: the closest key in {where} differs in {_fmt(fields, where, names)}{hint}"


def _hint(fields: list[tuple[str, Any, Any]], names: Sequence[str] | None) -> str:
    words = " ".join(_field(p, names) for p, _, _ in fields)
    if "mod_hash" in words:
        return " (the mask_mod/score_mod is other code, or a value it reads changed)"
    return ""


def report(
    store: Any,
    ref: EntryRef,
    encoded: str,
    names: Sequence[str] | None = None,
    *,
    quiet: bool = False,
    needed: bool = False,
) -> str | None:
    """Log :func:`explain` for a miss (see the module docstring) and return it; ``quiet``, or
    in a ``fa4cache warm`` process: at INFO level whatever it is (``warm`` misses on purpose). Never raises: it runs on the
    compile path. Where the line would not be logged, nothing is read and None comes back,
    unless the caller ``needed`` it (``FA4CACHE_EXPECT_WARM`` quotes it)."""
    from . import counters

    first = ref.kind not in _seen_kinds and not store.counters.by_kind.get(ref.kind, {}).get("disk_hits")
    # warm's misses (its generation calls' too) are its job, not news: never a warning there.
    first = first and not quiet and not counters.is_warm_process()
    _seen_kinds.add(ref.kind)
    level = logging.WARNING if first else logging.INFO
    if not log.isEnabledFor(level) and not needed:
        return None  # nobody reads the line: the stored keys are not read either
    try:
        why = explain(store, ref, encoded, names)
    except Exception as e:  # a diagnostic must never cost the compile
        log.debug("fa4cache: could not explain a miss: %s", e)
        return None
    if why is not None:
        log.log(level, "fa4cache: %s", why)
    return why
