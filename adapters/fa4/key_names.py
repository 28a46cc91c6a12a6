"""Names for the fields of FA4's compile keys, read from FA4's own source.

FA4 builds each entry point's key as a tuple literal (``compile_key = (dtype, head_dim,
..., mask_mod_hash, ...)``). A miss explained as "differs in [10]" means nothing to a user;
"differs in mask_mod_hash" does. The names are the tuple's element expressions, parsed
(never executed) from the installed FA4's modules, so they follow FA4 without a table.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import io
import json
import logging
import os
import re
import tokenize
from collections.abc import Iterator, Sequence
from typing import Any

from fa4cache.store.sidecar import short_dtype

log = logging.getLogger(__name__)


def kind_for(entry_point: str) -> str:
    """Store kind of an FA4 entry point, derived from its name (``_flash_attn_fwd`` ->
    ``fwd``, ``_bwd_preprocess`` -> ``bwd_preprocess``): no table to fall behind FA4."""
    name = entry_point.strip("_").lower()
    return name.removeprefix("flash_attn_") or name


_MODULES = ("flash_attn.cute.interface", "flash_attn.cute.compute_block_sparsity")


_KEY = re.compile(r"^([ \t]*)compile_key\s*=\s*\(", re.M)
_DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)", re.M)


@functools.lru_cache(maxsize=8)
def _parse(path: str, stamp: tuple[int, int]) -> dict[str, list[tuple[str, ...]]]:
    """Each ``compile_key = (...)`` tuple of the file, by the function that builds it. Only
    those statements are parsed (found by their text, cut at the closing parenthesis by
    Python's tokenizer): a whole FA4 module takes seconds to parse on a busy host, and this
    runs at a step's first miss."""
    del stamp  # the cache key: a new FA4 file is parsed again
    with open(path, encoding="utf-8") as f:
        text = f.read()
    defs = [(m.start(), len(m.group(1).expandtabs()), m.group(2)) for m in _DEF.finditer(text)]
    out: dict[str, list[tuple[str, ...]]] = {}
    for m in _KEY.finditer(text):
        indent = len(m.group(1).expandtabs())
        owner = next((name for at, ind, name in reversed(defs) if at < m.start() and ind < indent), None)
        statement = _statement(text, m.start() + len(m.group(1)))
        if owner is None or statement is None:
            continue
        node = ast.parse(statement).body[0]
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            names = tuple(ast.unparse(e) for e in node.value.elts)
            out.setdefault(kind_for(owner), []).append(names)
    return out


def _statement(text: str, start: int) -> str | None:
    """The source of the statement that starts at ``start``: up to its first newline outside
    brackets (strings and comments read as the tokenizer reads them)."""
    depth = 0
    lines = io.StringIO(text[start:]).readline
    try:
        for tok in tokenize.generate_tokens(lines):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER) and depth == 0:
                row, col = tok.end
                body = text[start:].splitlines(keepends=True)
                return "".join(body[: row - 1]) + body[row - 1][:col]
    except (tokenize.TokenError, SyntaxError, IndexError):
        return None
    return None


def _tables() -> dict[str, list[tuple[str, ...]]]:
    merged: dict[str, list[tuple[str, ...]]] = {}
    for module in _MODULES:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin:
            continue
        try:
            st = os.stat(spec.origin)
            table = _parse(spec.origin, (st.st_mtime_ns, st.st_size))
        except (OSError, SyntaxError) as e:
            log.debug("fa4cache: cannot read FA4's key names from %s: %s", spec.origin, e)
            continue
        for kind, tuples in table.items():
            merged.setdefault(kind, []).extend(tuples)
    return merged


def field_names(kind: str, length: int) -> tuple[str, ...] | None:
    """The names of an FA4 ``kind``'s key fields, for a key of ``length`` fields (an entry
    point that builds keys of two shapes has both); None when FA4's source does not say."""
    for names in _tables().get(kind, ()):
        if len(names) == length:
            return names
    return None


class LazyFieldNames(Sequence[str]):
    """:func:`field_names` of ``kind`` for a key of ``length`` fields, read from FA4's source
    only when a message names a field. A miss passes them to its diagnostics (the near-miss
    line, the compile-storm warning), which most misses never print: reading the source costs
    the first miss of a process (a compile server's child included) 10-30 ms before its
    compile starts."""

    def __init__(self, kind: str, length: int) -> None:
        self.kind, self.length = kind, length
        self._names: tuple[str, ...] | None = None

    def _read(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = field_names(self.kind, self.length) or ()
        return self._names

    def __len__(self) -> int:
        return len(self._read())

    def __getitem__(self, i: Any) -> Any:
        return self._read()[i]


def summary(kind: str, encoded: str) -> dict[str, Any]:
    """A few human-readable facts from the key text (for ``fa4cache ls``)."""

    try:
        key = json.loads(encoded)
    except ValueError:
        return {}
    out: dict[str, Any] = {}

    def walk(v: Any) -> Iterator[Any]:
        if isinstance(v, list):
            for x in v:
                yield from walk(x)
        else:
            yield v

    flat = list(walk(key))
    dtypes = [d["type"].rsplit(".", 1)[-1] for d in flat if isinstance(d, dict) and "type" in d]
    if dtypes:
        out["dtype"] = short_dtype(dtypes[0])
    ints = [int(d["i"]) for d in flat if isinstance(d, dict) and "i" in d]
    if kind in ("fwd", "bwd") and len(ints) >= 2:
        hd = [i for i in ints if i in (32, 64, 96, 128, 192, 256)]
        if hd:
            out["head_dim"] = hd[0]
    hashes = [v for v in flat if isinstance(v, str) and len(v) == 64]
    out["mask"] = hashes[0][:12] if hashes else None
    return out
