"""Code identity, round 2 (issue 49): a key is built only from what the walker proves.

Each variant runs in a fresh process (same module names, so the key compares as it would
between two runs): ``_keys`` writes a variant's files, imports ``main`` and prints the key of
each named object -- FA4's hash (:func:`fa4cache.adapters.fa4.keys.base_hash`), or a
``@jit_cache`` call's store key -- with the warning a memory-only key logged. The two-process
proofs with real compiles for the lambda row and a library-module row are in
tests/test_identity_kernels.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

_RUNNER = r"""
import json, logging, sys
sys.path.insert(0, sys.argv[1])
records = []
class H(logging.Handler):
    def emit(self, r):
        records.append(r.getMessage())
logging.getLogger().addHandler(H())
import main
from fa4cache.adapters.fa4.keys import base_hash
out = {}
for name in sys.argv[2:]:
    obj = getattr(main, name)
    records.clear()
    if hasattr(obj, "__fa4cache_jit__"):
        from fa4cache.errors import UnkeyableCode
        from fa4cache.hashing import encode_key
        try:
            key = encode_key(obj.__fa4cache_jit__.canonical(main.ARGS, {}))
        except UnkeyableCode as e:
            key, records[:] = "fa4cache-memory-only:", [str(e)]
    else:
        key = base_hash(obj)
    out[name] = {"key": key, "log": list(records)}
print("KEYS " + json.dumps(out))
"""


def _keys(tmp_path: Path, files: dict[str, str], *names: str) -> dict[str, dict[str, Any]]:
    """Keys of ``names`` of ``main`` after writing ``files`` in a fresh folder, in a fresh process."""
    d = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    for fname, text in files.items():
        (d / fname).write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(d), *names], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("KEYS ")][-1]
    return json.loads(line[5:])


def _memory_only(k: dict[str, Any]) -> bool:
    return k["key"].startswith("fa4cache-memory-only:")


# --------------------------------------------------------------------------- code objects, not text


def test_two_lambdas_on_one_line_get_their_own_keys(tmp_path: Path) -> None:
    # The key once held the line's text and "<lambda>": both lambdas shared it, and the second
    # run loaded the first one's kernel.
    main = """
    mask_a = lambda b, h, m, n, si, aux: n <= m + 64; mask_b = lambda b, h, m, n, si, aux: n <= m + 128
    score_a = lambda s, b, h, q, kv, aux: s * 2; score_b = lambda s, b, h, q, kv, aux: s * 3
    """
    k = _keys(tmp_path, {"main.py": main}, "mask_a", "mask_b", "score_a", "score_b")
    assert not any(_memory_only(v) for v in k.values()), k
    assert k["mask_a"]["key"] != k["mask_b"]["key"]
    assert k["score_a"]["key"] != k["score_b"]["key"]


_HARMLESS_BASE = {
    "helpers.py": '''
        """Helpers."""
        OFF = 3


        def offset(k):
            """The offset."""
            return k + OFF


        class Band:
            WIDTH = 8

            def width(self):
                return self.WIDTH
        ''',
    "main.py": """
        import json
        from helpers import Band, offset

        BAND = Band()


        def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
            lo = m_idx - BAND.width()
            return (n_idx <= m_idx + offset(2)) & (n_idx >= lo)
        """,
}


def _edit(file: str, old: str, new: str) -> dict[str, str]:
    files = dict(_HARMLESS_BASE)
    text = textwrap.dedent(files[file])
    assert old in text, old
    files[file] = text.replace(old, new, 1)
    return files


_HARMLESS = {
    "comment inside the mask": _edit("main.py", "    lo =", "    # the band's lower edge\n    lo ="),
    "docstring of a helper it calls": _edit(
        "helpers.py", '"""The offset."""', '"""How far the band reaches."""'
    ),
    "comment in a class it reaches": _edit(
        "helpers.py", "    WIDTH = 8\n", "    # in tokens\n    WIDTH = 8  # per side\n"
    ),
    "reformatting": _edit(
        "main.py",
        "    return (n_idx <= m_idx + offset(2)) & (n_idx >= lo)",
        "    return (\n        (n_idx <= m_idx + offset(2))\n        & (n_idx >= lo)\n    )",
    ),
    "blank lines above the mask": _edit("main.py", "BAND = Band()\n", "BAND = Band()\n\n\n\n\n"),
    "a docstring of the mask": _edit(
        "main.py", "aux_tensors):\n", 'aux_tensors):\n    """A band below the diagonal."""\n'
    ),
    "an unrelated global": _edit("main.py", "BAND = Band()\n", "BAND = Band()\nUNUSED = 12345\n"),
    "an unrelated function": _edit(
        "main.py", "BAND = Band()\n", "BAND = Band()\ndef unused():\n    return 7\n"
    ),
    "an unrelated import": _edit("main.py", "import json\n", "import json\nimport os\n"),
}


def test_harmless_edits_keep_the_key_and_a_real_one_does_not(tmp_path: Path) -> None:
    base = _keys(tmp_path, _HARMLESS_BASE, "mask_mod")["mask_mod"]
    assert not _memory_only(base), base
    kept = []
    for what, files in _HARMLESS.items():
        if _keys(tmp_path, files, "mask_mod")["mask_mod"]["key"] == base["key"]:
            kept.append(what)
    assert kept == list(_HARMLESS), f"changed the key: {sorted(set(_HARMLESS) - set(kept))}"
    # Not a test that cannot fail: a value, a parameter's use, an operator each change it.
    for files in (
        _edit("helpers.py", "OFF = 3", "OFF = 4"),
        _edit("helpers.py", "return k + OFF", "return k - OFF"),
        _edit("main.py", "(n_idx >= lo)", "(n_idx > lo)"),
    ):
        assert _keys(tmp_path, files, "mask_mod")["mask_mod"]["key"] != base["key"]


def test_line_numbers_count_only_when_the_dsl_builds_line_info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Measured: line numbers do not reach a kernel's bytes (a mask_mod with lines added above
    # it compiles to the same sha256); a CUTE_DSL_LINEINFO=1 build puts them there.
    mask = "def mask_mod(b, h, m, n, si, aux):\n    return n <= m\n"
    for lineinfo, same in (("0", True), ("1", False)):
        monkeypatch.setenv("CUTE_DSL_LINEINFO", lineinfo)
        a, b = (_keys(tmp_path, {"main.py": "\n" * blank + mask}, "mask_mod")["mask_mod"] for blank in (0, 3))
        assert (a["key"] == b["key"]) is same, (lineinfo, a, b)


def test_parameters_swapped_in_the_file_after_import_are_an_edit(tmp_path: Path) -> None:
    # def off(a, b): a - b -> def off(b, a): b - a shares bytecode, constants and names.
    helpers = tmp_path / "idsw_helpers.py"
    helpers.write_text("def off(a, b):\n    return a - b\n")
    (tmp_path / "idsw_main.py").write_text(
        "from idsw_helpers import off\ndef mask_mod(m, n):\n    return n <= off(m, 1)\n"
    )
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import idsw_main
        from fa4cache.errors import UnkeyableCode
        from fa4cache.identity import identity
        identity(idsw_main.mask_mod)
        with open({str(helpers)!r}, "w") as f:
            f.write("def off(b, a):\\n    return b - a\\n")
        os.utime({str(helpers)!r}, ns=(0, 10**9))
        try:
            identity(idsw_main.mask_mod)
        except UnkeyableCode as e:
            print("UNKEYABLE", e)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "UNKEYABLE" in p.stdout and "changed on disk" in p.stdout, p.stdout


# --------------------------------------------------------------------------- library reads


_LIBRARY_READS = {
    "os.environ": ("import os\nos.environ['IDL_W'] = '64'\n", "int(os.environ['IDL_W'])", "os.environ"),
    "os.getenv": ("import os\nos.environ['IDL_W'] = '64'\n", "int(os.getenv('IDL_W'))", "os.getenv"),
    "sys.modules": ("import sys, cfg\n", "sys.modules['cfg'].W", "sys.modules"),
    "importlib.import_module": (
        "import importlib\n",
        "importlib.import_module('cfg').W",
        "importlib.import_module",
    ),
    "open": ("", "int(open(PATH).read())", "open"),
    "sys._getframe": ("import sys\nW = 64\n", "sys._getframe(0).f_globals['W']", "sys._getframe"),
    "lru_cache helper": (
        "import functools, cfg\n@functools.lru_cache\ndef width():\n    return cfg.W\n",
        "width()",
        "width",
    ),
    "__getattr__ delegation": (
        "import cfg\nclass Proxy:\n    def __getattr__(self, name):\n        return getattr(cfg, name)\nP = Proxy()\n",
        "P.W",
        "__getattr__",
    ),
    "dict subclass with state": (
        "class D(dict):\n    def w(self):\n        return self.width\nD_ = D()\nD_.width = 64\n",
        "D_.w()",
        "D_",
    ),
    "list subclass with state": (
        "class L(list):\n    def w(self):\n        return self.width\nL_ = L()\nL_.width = 64\n",
        "L_.w()",
        "L_",
    ),
}


@pytest.mark.parametrize("form", sorted(_LIBRARY_READS))
def test_reads_through_library_code_keep_the_kernel_in_memory(tmp_path: Path, form: str) -> None:
    # Each was keyed "by name" (a library module's attribute, a library function, a wrapper's
    # __wrapped__, a container's items): a changed value reused the old kernel.
    setup, expr, named = _LIBRARY_READS[form]
    path = tmp_path / "w.txt"
    path.write_text("64")
    main = f"PATH = {str(path)!r}\n{setup}\ndef mask_mod(b, h, m, n, si, aux):\n    return n <= m + {expr}\n"
    main += f"def score_mod(s, b, h, q, kv, aux):\n    return s * {expr}\n"
    for name in ("mask_mod", "score_mod"):  # one process each: the warning is given once per name
        k = _keys(tmp_path, {"main.py": main, "cfg.py": "W = 64\n"}, name)[name]
        assert _memory_only(k), f"{form}: {k}"
        assert any(named in line and "Fix:" in line for line in k["log"]), k["log"]


def test_a_value_kept_on_a_library_module_is_rechecked(tmp_path: Path) -> None:
    # torch.some_setting = 128 after the first call: the memoised digest skipped reads through
    # library modules. (json here: a library module that imports in milliseconds.)
    sys.path.insert(0, str(tmp_path))
    try:
        (tmp_path / "idlm_main.py").write_text(
            "import json\njson.idlm_setting = 64\ndef mask_mod(m, n):\n    return n <= m + json.idlm_setting\n"
        )
        import idlm_main

        from fa4cache.identity import current

        first = current(idlm_main.mask_mod)
        import json as library

        library.idlm_setting = 128  # type: ignore[attr-defined]
        assert not first.valid()
        assert current(idlm_main.mask_mod).digest != first.digest
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("idlm_main", None)


def test_pure_library_calls_stay_persistent(tmp_path: Path) -> None:
    # The allow-list is not a wall: math, operator, pure builtins, partials and the code
    # generators' own functions (FA4's test masks call utils.scalar_to_ssa, cute.where) key.
    main = """
    import functools, math, operator
    def _add(a, b, k):
        return a + b + k
    add3 = functools.partial(_add, k=3)
    def mask_mod(b, h, m, n, si, aux):
        return operator.le(n, add3(m, max(1, int(math.floor(2.5))), ))
    """
    k = _keys(tmp_path, {"main.py": main}, "mask_mod")["mask_mod"]
    assert not _memory_only(k), k


# --------------------------------------------------------------------------- wrappers


def test_wrappers_do_not_borrow_an_inner_masks_identity(tmp_path: Path) -> None:
    # A functools.wraps copy of __fa4cache_identity__ / __cute_hash__, or a __getattr__
    # delegating to the inner mask, once stood for the wrapper: its own code and closure
    # (the + k) never reached the key.
    main = """
    import functools
    import fa4cache

    @fa4cache.mask_template
    def banded(width: int):
        def mask_mod(b, h, m, n, si, aux):
            return n <= m + width
        return mask_mod

    INNER = banded(width=64)

    def shift(fn, k):
        @functools.wraps(fn)
        def wrapper(b, h, m, n, si, aux):
            return fn(b, h, m + k, n, si, aux)
        return wrapper

    class Delegate:
        def __init__(self, inner, k):
            self.inner, self.k = inner, k
        def __getattr__(self, name):
            return getattr(self.inner, name)
        def __call__(self, b, h, m, n, si, aux):
            return self.inner(b, h, m + self.k, n, si, aux)

    W5, W6 = shift(INNER, 5), shift(INNER, 6)
    D5, D6 = Delegate(INNER, 5), Delegate(INNER, 6)
    """
    k = _keys(tmp_path, {"main.py": main}, "INNER", "W5", "W6", "D5", "D6")
    assert k["INNER"]["key"].startswith("fa4cache:"), k
    assert len({k[n]["key"] for n in ("INNER", "W5", "W6")}) == 3, k
    for d in ("D5", "D6"):
        assert _memory_only(k[d]) or k[d]["key"] != k["INNER"]["key"], k
    assert k["D5"]["key"] != k["D6"]["key"]


# --------------------------------------------------------------------------- @jit_cache arguments


_JIT_ARGS = {
    "a class": ("class C:\n    K = {v}\nARGS = (C,)\n", "1", "2"),
    "an enum member": ("import enum\nclass M(enum.Enum):\n    A = {v}\nARGS = (M.A,)\n", "1", "2"),
    "an IntEnum member whose class changed": (
        "import enum\nclass M(enum.IntEnum):\n    A = 1\n    def scale(self):\n        return {v}\nARGS = (M.A,)\n",
        "1",
        "2",
    ),
    "a dataclass holding a class": (
        "import dataclasses\nclass C:\n    K = {v}\n@dataclasses.dataclass(frozen=True)\nclass Cfg:\n"
        "    kind: type\nARGS = (Cfg(C),)\n",
        "1",
        "2",
    ),
    "a config object whose method changed": (
        "class Cfg:\n    def __init__(self):\n        self.tile = 128\n    def scale(self):\n        return {v}\nARGS = (Cfg(),)\n",
        "1.0",
        "2.0",
    ),
    "a callable": ("def act(x):\n    return x * {v}\nARGS = (act,)\n", "1", "2"),
}


@pytest.mark.parametrize("form", sorted(_JIT_ARGS))
def test_jit_cache_arguments_are_valued_by_the_walker(tmp_path: Path, form: str) -> None:
    # Encoded by their type's name, the two variants once shared one entry.
    text, a, b = _JIT_ARGS[form]
    kernel = "import fa4cache\n@fa4cache.jit_cache\ndef compile_k(arg):\n    return arg\n"
    keys = [_keys(tmp_path, {"main.py": kernel + text.format(v=v)}, "compile_k")["compile_k"] for v in (a, b)]
    assert not any(_memory_only(k) for k in keys), keys
    assert keys[0]["key"] != keys[1]["key"], f"{form}: both variants have one key"


def test_jit_cache_argument_no_key_can_value_compiles_in_memory(tmp_path: Path) -> None:
    main = "import os, fa4cache\n@fa4cache.jit_cache\ndef compile_k(arg):\n    return arg\nARGS = (os.environ,)\n"
    k = _keys(tmp_path, {"main.py": main}, "compile_k")["compile_k"]
    assert _memory_only(k) and "argument 'arg'" in k["log"][0], k


# --------------------------------------------------------------------------- toolchain


def test_the_toolchain_id_covers_the_dsl_python_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CUTLASS DSL patched locally, same version: once the same toolchain id.
    import types

    from fa4cache import fingerprint

    pkg = tmp_path / "cutlass"
    (pkg / "cute").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    op = pkg / "cute" / "op.py"
    op.write_text("def where(a, b, c):\n    return a\n")
    fake = types.ModuleType("cutlass")
    fake.__path__ = [str(pkg)]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cutlass", fake)
    before = fingerprint.toolchain(90)
    op.write_text("def where(a, b, c):\n    return b\n")
    os.utime(op, ns=(0, 10**9))
    after = fingerprint.toolchain(90)
    assert before.dsl_source_digest != "absent"
    assert before.id != after.id and before.dsl_source_digest != after.dsl_source_digest
