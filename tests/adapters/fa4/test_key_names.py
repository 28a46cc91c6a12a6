"""FA4's compile-key field names, read from its source at a step's first miss."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from fa4cache.adapters.fa4 import key_names


def _whole_parse(path: str) -> dict[str, list[tuple[str, ...]]]:
    # The reference: the whole module parsed, every function's ``compile_key = (...)``.
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    out: dict[str, list[tuple[str, ...]]] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in fn.body:
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "compile_key" for t in sub.targets)
                        and isinstance(sub.value, ast.Tuple)
                    ):
                        out.setdefault(key_names.kind_for(fn.name), []).append(
                            tuple(ast.unparse(e) for e in sub.value.elts)
                        )
    return out


def _parse(path: Path) -> dict[str, list[tuple[str, ...]]]:
    st = os.stat(path)
    return key_names._parse(str(path), (st.st_mtime_ns, st.st_size))


def test_the_statements_read_alone_name_what_a_whole_parse_of_fa4s_modules_names() -> None:
    pytest.importorskip("flash_attn.cute")
    import importlib.util

    for module in key_names._MODULES:
        origin = importlib.util.find_spec(module).origin
        assert _parse(Path(origin)) == _whole_parse(origin), module


def test_strings_comments_and_nested_functions_do_not_mislead_the_reader(tmp_path: Path) -> None:
    src = tmp_path / "fa4_like.py"
    src.write_text(
        """
def _flash_attn_fwd(q, k):
    note = "compile_key = (not, this)"  # compile_key = (nor, this)
    def helper():
        return ")"
    compile_key = (
        q.dtype,  # a comment with a ) in it
        "a string with ) and (",
        helper(),
        (k.shape[0], k.shape[1]),
    )
    return compile_key


async def _bwd_preprocess(x):
    if x:
        compile_key = (x, 1)
    else:
        compile_key = (x, 2, 3)
    return compile_key
""",
        encoding="utf-8",
    )
    got = _parse(src)
    assert got == _whole_parse(str(src))
    assert got["fwd"] == [("q.dtype", "'a string with ) and ('", "helper()", "(k.shape[0], k.shape[1])")]
    assert got["bwd_preprocess"] == [("x", "1"), ("x", "2", "3")]
