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
import logging
import os

log = logging.getLogger(__name__)


def kind_for(entry_point: str) -> str:
    """Store kind of an FA4 entry point, derived from its name (``_flash_attn_fwd`` ->
    ``fwd``, ``_bwd_preprocess`` -> ``bwd_preprocess``): no table to fall behind FA4."""
    name = entry_point.strip("_").lower()
    return name.removeprefix("flash_attn_") or name

_MODULES = ("flash_attn.cute.interface", "flash_attn.cute.compute_block_sparsity")


@functools.lru_cache(maxsize=8)
def _parse(path: str, stamp: tuple[int, int]) -> dict[str, list[tuple[str, ...]]]:
    del stamp  # the cache key: a new FA4 file is parsed again
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out: dict[str, list[tuple[str, ...]]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "compile_key" for t in node.targets)
                and isinstance(node.value, ast.Tuple)
            ):
                names = tuple(ast.unparse(e) for e in node.value.elts)
                out.setdefault(kind_for(fn.name), []).append(names)
    return out


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
