"""No run ever loads a kernel compiled for other code.

Each case is user code the way users write it (a raw FA4 ``mask_mod``, a mask template, a
``@fa4cache.jit_cache`` kernel), in files of its own. Process 1 runs variant A into a store;
the files change; process 2 runs variant B against the same store; process 3 runs variant B
into a clean store. Every kernel the clean run filed must be in the shared store with the
same bytes: process 2 either compiled it (a new key) or loaded exactly its own kernel. A key
that misses a change files B under A's digest, and the bytes differ.

All compiles are real CuTe-DSL cross-compiles on the CPU (sm_90).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, finish, worker_env

pytestmark = pytest.mark.compile

_JIT_KERNEL = """
import cutlass
import cutlass.cute as cute

import fa4cache

THREADS = 128


def make(scale_of):
    @cute.kernel
    def _k(x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < x.shape[0]:
            y[i] = (x[i] * scale_of()).to(y.element_type)

    @cute.jit
    def _launch(x: cute.Tensor, y: cute.Tensor, stream: object):
        _k(x, y).launch(grid=((x.shape[0] + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @fa4cache.jit_cache
    def compile_scale(dtype):
        n = cute.sym_int()
        x = cute.runtime.make_fake_tensor(dtype, (n,), stride=(1,), assumed_align=16)
        y = cute.runtime.make_fake_tensor(dtype, (n,), stride=(1,), assumed_align=16)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return cute.compile(_launch, x, y, stream, options="--enable-tvm-ffi")

    return compile_scale
"""


def _mask_case(
    mask_expr: str, files: dict[str, tuple[str, str]], setup: str = ""
) -> dict[str, tuple[str, str]]:
    """A raw FA4 mask_mod whose body is ``n_idx <= m_idx + <mask_expr>``."""
    main = f"""
import cutlass.cute as cute
from identity_runner import fa4_forward
{setup}

@cute.jit
def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
    return n_idx <= m_idx + {mask_expr}

def run():
    fa4_forward(mask_mod)
"""
    return {**files, "MAIN": (main, main)}


def _cases(tag: str) -> dict[str, dict[str, tuple[str, str]]]:
    """name -> {file: (variant A text, variant B text)}; "MAIN" is main_<name>.py."""
    jit_main = f"""
import cutlass
from jit_{tag}_kernel import make
from {{route}} import scale_of

def run():
    make(scale_of)(cutlass.Float32)
"""
    c: dict[str, dict[str, tuple[str, str]]] = {}
    # -- raw FA4 mask_mods (fa4cache.install(); FA4's own hash_callable keys them by source + repr)
    c["raw_global"] = {
        "MAIN": (
            "import cutlass.cute as cute\nfrom identity_runner import fa4_forward\nWINDOW = 64\n"
            "@cute.jit\ndef mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):\n"
            "    return n_idx <= m_idx + WINDOW\ndef run():\n    fa4_forward(mask_mod)\n",
            "import cutlass.cute as cute\nfrom identity_runner import fa4_forward\nWINDOW = 128\n"
            "@cute.jit\ndef mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):\n"
            "    return n_idx <= m_idx + WINDOW\ndef run():\n    fa4_forward(mask_mod)\n",
        )
    }
    # A user's functools.wraps decorator: its own code once went unread (inspect.getsource
    # follows __wrapped__), and the second run loaded the first one's kernel.
    wraps = """
import functools
import cutlass.cute as cute
from identity_runner import fa4_forward

def shift(fn):
    @functools.wraps(fn)
    def wrapper(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
        return fn(b, h, m_idx + SHIFT, n_idx, seqlen_info, aux_tensors)
    return wrapper

@shift
@cute.jit
def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
    return n_idx <= m_idx

def run():
    fa4_forward(mask_mod)
"""
    c["raw_wraps_decorator"] = {"MAIN": (wraps.replace("SHIFT", "5"), wraps.replace("SHIFT", "6"))}
    closure = """
import cutlass.cute as cute
from identity_runner import fa4_forward

class Band:
    def __init__(self, width):
        self.width = width
    def __repr__(self):
        return "Band()"  # the same repr whatever the width: FA4's hash cannot tell them apart

def factory(band):
    @cute.jit
    def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
        return n_idx <= m_idx + band.width
    return mask_mod

def run():
    fa4_forward(factory(Band(WIDTH)))
"""
    c["raw_closure_object"] = {"MAIN": ("WIDTH = 32\n" + closure, "WIDTH = 96\n" + closure)}
    opaque = """
import cutlass.cute as cute
from identity_runner import fa4_forward

import threading

class Band:
    def __init__(self, width):
        self.width = width
        self.lock = threading.Lock()  # no value to key it by
    def __repr__(self):
        return "Band()"

def width_of(band):
    return band.width

def factory(band):
    @cute.jit
    def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
        return n_idx <= m_idx + width_of(band)  # the object itself travels: not keyable by value
    return mask_mod

def run():
    fa4_forward(factory(Band(WIDTH)))
"""
    c["raw_opaque_object"] = {"MAIN": ("WIDTH = 32\n" + opaque, "WIDTH = 96\n" + opaque)}
    c["raw_attr_of_module"] = _mask_case(
        "cfg.WIDTH",
        {f"cfg_{tag}.py": ("WIDTH = 16\n", "WIDTH = 48\n")},
        setup=f"import cfg_{tag} as cfg",
    )
    c["raw_helper_other_module"] = _mask_case(
        "helpers.offset()",
        {f"helpers_{tag}.py": ("def offset():\n    return 8\n", "def offset():\n    return 24\n")},
        setup=f"import helpers_{tag} as helpers",
    )
    c["raw_helper_torch_named"] = _mask_case(
        "offset()",
        {f"torch_{tag}_helpers.py": ("def offset():\n    return 8\n", "def offset():\n    return 24\n")},
        setup=f"from torch_{tag}_helpers import offset",
    )
    # The same mask text in two packages, with different constants.
    pkg = "import cutlass.cute as cute\nWINDOW = {w}\n@cute.jit\ndef mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):\n    return n_idx <= m_idx + WINDOW\n"
    c["raw_two_packages"] = {
        f"pa_{tag}/__init__.py": ("", ""),
        f"pa_{tag}/masks.py": (pkg.format(w=40), pkg.format(w=40)),
        f"pb_{tag}/__init__.py": ("", ""),
        f"pb_{tag}/masks.py": (pkg.format(w=80), pkg.format(w=80)),
        "MAIN": (
            f"from identity_runner import fa4_forward\nfrom pa_{tag}.masks import mask_mod\ndef run():\n    fa4_forward(mask_mod)\n",
            f"from identity_runner import fa4_forward\nfrom pb_{tag}.masks import mask_mod\ndef run():\n    fa4_forward(mask_mod)\n",
        ),
    }
    # A module constant set at run time (args.window), the file unchanged.
    c["raw_set_at_run_time"] = {
        f"rt_{tag}_masks.py": (pkg.format(w=64), pkg.format(w=64)),
        "MAIN": (
            # Twice at 64 (one compile, then FA4's memory), then 96: a second compile in the same process.
            f"from identity_runner import fa4_forward\nimport rt_{tag}_masks as masks\ndef run():\n    masks.WINDOW = 64\n"
            "    fa4_forward(masks.mask_mod)\n    fa4_forward(masks.mask_mod)\n    masks.WINDOW = 96\n    fa4_forward(masks.mask_mod)\n",
            f"from identity_runner import fa4_forward\nimport rt_{tag}_masks as masks\ndef run():\n    masks.WINDOW = 128\n    fa4_forward(masks.mask_mod)\n",
        ),
    }
    # -- mask templates
    tmpl = """
import cutlass.cute as cute
import fa4cache
from identity_runner import fa4_forward
{setup}

@fa4cache.mask_template
def banded(causal: bool):
    @cute.jit
    def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
        return n_idx <= m_idx + {expr}
    return mask_mod

def run():
    fa4_forward(banded(causal=True))
"""
    c["template_attr"] = {
        f"tcfg_{tag}.py": ("WIDTH = 16\n", "WIDTH = 48\n"),
        "MAIN": (tmpl.format(setup=f"import tcfg_{tag} as cfg", expr="cfg.WIDTH"),) * 2,
    }
    c["template_helper_other_module"] = {
        f"thelp_{tag}.py": ("def offset():\n    return 8\n", "def offset():\n    return 24\n"),
        "MAIN": (tmpl.format(setup=f"import thelp_{tag} as helpers", expr="helpers.offset()"),) * 2,
    }
    c["template_helper_torch_named"] = {
        f"torch_t{tag}.py": ("def offset():\n    return 8\n", "def offset():\n    return 24\n"),
        "MAIN": (tmpl.format(setup=f"from torch_t{tag} import offset", expr="offset()"),) * 2,
    }
    # -- @fa4cache.jit_cache kernels: one kernel module, the scale reached by several routes
    kernel = {f"jit_{tag}_kernel.py": (_JIT_KERNEL, _JIT_KERNEL)}

    def jit(route: str, a: str, b: str, main_extra: str = "") -> dict[str, tuple[str, str]]:
        main = jit_main.format(route=route) + main_extra
        return {**kernel, f"{route}.py": (a, b), "MAIN": (main, main)}

    c["jit_attribute"] = jit(
        f"jattr_{tag}",
        "import types\ncfg = types.SimpleNamespace(SCALE=2.0)\ndef scale_of():\n    return cfg.SCALE\n",
        "import types\ncfg = types.SimpleNamespace(SCALE=3.0)\ndef scale_of():\n    return cfg.SCALE\n",
    )
    c["jit_helper_body"] = {
        **kernel,
        f"jhb_{tag}_helpers.py": ("def value():\n    return 2.0\n", "def value():\n    return 5.0\n"),
        f"jhb_{tag}.py": (f"from jhb_{tag}_helpers import value\ndef scale_of():\n    return value()\n",) * 2,
        "MAIN": (jit_main.format(route=f"jhb_{tag}"),) * 2,
    }
    c["jit_torch_named_module"] = jit(
        f"torch_j{tag}", "def scale_of():\n    return 2.0\n", "def scale_of():\n    return 7.0\n"
    )
    bound = "class Scaler:\n    def get(self):\n        return {v}\nscale_of = Scaler().get\n"
    c["jit_bound_method"] = jit(f"jbm_{tag}", bound.format(v=2.0), bound.format(v=4.0))
    dc = (
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass Cfg:\n    base: float = 1.0\n"
        "    def scale(self):\n        return self.base * {m}\nCFG = Cfg()\ndef scale_of():\n    return CFG.scale()\n"
    )
    c["jit_dataclass_method"] = jit(f"jdc_{tag}", dc.format(m=2.0), dc.format(m=6.0))
    # A module value changed after the first call: no memoised digest outlives it.
    c["jit_changed_after_first_call"] = {
        **kernel,
        f"jca_{tag}.py": ("SCALE = 2.0\ndef scale_of():\n    return SCALE\n",) * 2,
        "MAIN": (
            f"import cutlass\nimport jca_{tag} as m\nfrom jit_{tag}_kernel import make\n"
            "def run():\n    f = make(m.scale_of)\n    f(cutlass.Float32)\n    m.SCALE = 9.0\n    f(cutlass.Float32)\n",
            f"import cutlass\nimport jca_{tag} as m\nfrom jit_{tag}_kernel import make\n"
            "def run():\n    m.SCALE = 9.0\n    make(m.scale_of)(cutlass.Float32)\n",
        ),
    }
    return c


def _random_cases(rng: random.Random, n: int, tag: str) -> dict[str, dict[str, tuple[str, str]]]:
    """Random jit kernels whose scale comes through a random chain of routes (helpers in
    other modules, attributes, closures, defaults, class attributes, nested packages), one
    link of which changes between the variants (or nothing changes)."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    kernel = {f"jit_{tag}_kernel.py": (_JIT_KERNEL, _JIT_KERNEL)}
    for i in range(n):
        name = f"rand{i}"
        mod = f"r{i}_{tag}"
        depth = rng.randint(1, 4)
        change = rng.randrange(depth + 1)  # == depth: nothing changes
        files: dict[str, list[str]] = {}
        prev = None
        for level in range(depth):
            route = rng.choice(["helper", "attr", "closure", "default", "classattr", "package"])
            here = f"{mod}_l{level}"
            path = f"{here}.py"
            if route == "package":
                files[f"{here}/__init__.py"] = ["", ""]
                path = f"{here}/inner.py"
                here = f"{here}.inner"
            value = [float(rng.randint(1, 9)), float(rng.randint(1, 9))]
            if level != change:
                value[1] = value[0]
            texts = []
            for v in value:
                src = f"from {prev} import scale_of as _prev\n" if prev else "def _prev():\n    return 1.0\n"
                if route in ("helper", "package"):
                    src += f"def scale_of():\n    return _prev() * {v}\n"
                elif route == "attr":
                    src += f"import types\nK = types.SimpleNamespace(v={v})\ndef scale_of():\n    return _prev() * K.v\n"
                elif route == "closure":
                    src += f"def _make(k):\n    def scale_of():\n        return _prev() * k\n    return scale_of\nscale_of = _make({v})\n"
                elif route == "default":
                    src += f"def scale_of(k={v}):\n    return _prev() * k\n"
                else:
                    src += f"class C:\n    K = {v}\ndef scale_of():\n    return _prev() * C.K\n"
                texts.append(src)
            files[path] = texts
            prev = here
        main = f"import cutlass\nfrom jit_{tag}_kernel import make\nfrom {prev} import scale_of\ndef run():\n    make(scale_of)(cutlass.Float32)\n"
        out[name] = {**kernel, **{k: (v[0], v[1]) for k, v in files.items()}, "MAIN": (main, main)}
    return out


def _write(root: Path, cases: dict[str, dict[str, tuple[str, str]]], variant: int) -> None:
    for name, files in cases.items():
        d = root / name
        for fname, texts in files.items():
            path = d / (f"main_{name}.py" if fname == "MAIN" else fname)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(texts[variant]))
            # A rewrite within the same second must still be seen as new source.
            os.utime(path, ns=(0, 10**9 * (variant + 1)))
        for pyc in d.rglob("__pycache__"):
            for f in pyc.iterdir():
                f.unlink()


def _start(
    cases_dir: Path, store: Path, names: list[str], *, ahead: bool = False, **extra: str
) -> subprocess.Popen[str]:
    env = worker_env(
        store, FA4CACHE_COMPILE_AHEAD="1" if ahead else "0", PYTHONDONTWRITEBYTECODE="1", **extra
    )
    # The cases' folders too: a compile server started by the process imports them by name.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests" / "helpers"), str(ROOT), *(str(cases_dir / n) for n in names)]
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.identity_runner", str(cases_dir), *names],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _side_by_side(*runs: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """The results of independent runs (each its own store, over files that no longer
    change), started together."""
    try:
        return [finish(p, timeout=1200) for p in runs]
    finally:
        for p in runs:
            p.kill()  # a no-op once it has exited; none is left running after a failure


def _run(cases_dir: Path, store: Path, names: list[str], *, ahead: bool = False) -> dict[str, Any]:
    return _side_by_side(_start(cases_dir, store, names, ahead=ahead))[0]


def _entries(store: Path) -> dict[tuple[str, str], str]:
    """(kind, digest) -> sha256 of every entry in the store."""
    out = {}
    for sidecar in (store / "v2").glob("*/*/*.json"):
        if sidecar.name == "toolchain.json":
            continue
        meta = json.loads(sidecar.read_text())
        out[(meta["kind"], meta["digest"])] = meta["sha256"]
    return out


def _check(tmp_path: Path, cases: dict[str, dict[str, tuple[str, str]]]) -> dict[str, Any]:
    names = sorted(cases)
    src, shared, clean = tmp_path / "cases", tmp_path / "shared", tmp_path / "clean"
    _write(src, cases, 0)
    first = _run(src, shared, names)
    _write(src, cases, 1)
    # Variant B into the shared store and into a clean one.
    second, own = _side_by_side(_start(src, shared, names), _start(src, clean, names))
    have, want = _entries(shared), _entries(clean)
    wrong = {k for k, sha in want.items() if have.get(k) not in (None, sha)}
    assert not wrong, f"the shared store serves other code's bytes for {sorted(wrong)}"
    missing = set(want) - set(have)
    assert not missing, f"variant B's kernels neither compiled nor loaded: {sorted(missing)}"
    return {"first": first, "second": second, "own": own}


def test_every_change_between_runs_compiles_or_loads_its_own_bytes(tmp_path: Path) -> None:
    cases = _cases("t")
    runs = _check(tmp_path, cases)
    second = runs["second"]
    # Each variant B here is other code than A: a run that compiled nothing served A's kernel.
    for name in cases:
        if name == "raw_opaque_object":
            assert second[name]["memory_only_compiles"] >= 1, second[name]
            continue
        if name == "jit_changed_after_first_call":
            # B's value is A's after its change: A's second kernel, which A stored, is B's own
            # (its bytes equal B's clean compile, checked above). The key once differed with
            # whether the DSL had traced the function yet (inspect.getsource read the function,
            # not its original code object), and B compiled it again.
            assert (second[name]["compiles"], second[name]["disk_hits"]) == (0, 1), second[name]
            continue
        assert second[name]["compiles"] >= 1, f"{name}: {second[name]}"
    # And what did not change loads: the first variant of the run-time case is in the store.
    assert runs["first"]["jit_changed_after_first_call"]["compiles"] == 2
    assert runs["first"]["raw_set_at_run_time"]["compiles"] == 2
    assert runs["first"]["raw_global"]["compiles"] == 1


def test_random_variants_never_load_other_code(tmp_path: Path) -> None:
    seed = int(os.environ.get("FA4CACHE_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (FA4CACHE_TEST_SEED={seed} repeats it)")
    rng = random.Random(seed)
    cases = _random_cases(rng, 6, "r")
    runs = _check(tmp_path, cases)
    for name, files in cases.items():
        unchanged = all(a == b for a, b in files.values())
        if unchanged:
            assert runs["second"][name]["compiles"] == 0, f"seed {seed}: {name} recompiled unchanged code"


def test_a_constant_set_at_run_time_never_reaches_the_compile_server_as_other_code(tmp_path: Path) -> None:
    # The process sets masks.WINDOW = 128 at run time (args.window); the file says 64. The
    # compile server, which imports the module afresh, must not compile the backward from
    # the file's value under the process's key.
    pkg = "import cutlass.cute as cute\nWINDOW = {w}\n@cute.jit\ndef mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):\n    return n_idx <= m_idx + WINDOW\n"
    main = "from identity_runner import fa4_forward_backward\nimport ah_masks as masks\ndef run():\n    masks.WINDOW = 128\n    fa4_forward_backward(masks.mask_mod, backward={bwd})\n"
    forward_only = {"ahead": {"ah_masks.py": (pkg.format(w=64),) * 2, "MAIN": (main.format(bwd=False),) * 2}}
    src, shared, clean = tmp_path / "cases", tmp_path / "shared", tmp_path / "clean"
    _write(src, forward_only, 0)
    first = _run(src, shared, ["ahead"], ahead=True)
    assert first["ahead"]["compiles"] == 1, first  # the forward, here
    kinds = {k for k, _ in _entries(shared)}
    assert kinds == {"fwd"}, f"the compile server published {kinds - {'fwd'}} for other code"
    # The process's own backward, then a clean run of the file saying 128: the same bytes.
    both = {"ahead": {"ah_masks.py": (pkg.format(w=64),) * 2, "MAIN": (main.format(bwd=True),) * 2}}
    _write(src, both, 0)
    clean_case = {"ahead": {"ah_masks.py": (pkg.format(w=128),) * 2, "MAIN": (main.format(bwd=True),) * 2}}
    clean_src = tmp_path / "clean_cases"
    _write(clean_src, clean_case, 0)
    _side_by_side(_start(src, shared, ["ahead"]), _start(clean_src, clean, ["ahead"]))
    have, want = _entries(shared), _entries(clean)
    assert set(want) <= set(have) and all(have[k] == v for k, v in want.items())


def _round_two_cases() -> dict[str, dict[str, tuple[str, str]]]:
    """Issue 49's rows, as real cross-compiles: the file of variant B differs from A only in
    which lambda runs, or in a value read through a library module."""
    lambdas = (
        "from identity_runner import fa4_forward\n"
        "mask_a = lambda b, h, m_idx, n_idx, seqlen_info, aux_tensors: n_idx <= m_idx + 64; "
        "mask_b = lambda b, h, m_idx, n_idx, seqlen_info, aux_tensors: n_idx <= m_idx + 128\n"
        "def run():\n    fa4_forward({which})\n"
    )
    environ = (
        "import os\nfrom identity_runner import fa4_forward\nos.environ['FA4CACHE_T49_W'] = '{w}'\n"
        "def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):\n"
        "    return n_idx <= m_idx + int(os.environ['FA4CACHE_T49_W'])\n"
        "def run():\n    fa4_forward(mask_mod)\n"
    )
    return {
        "raw_two_lambdas_one_line": {
            "MAIN": (lambdas.format(which="mask_a"), lambdas.format(which="mask_b"))
        },
        "raw_os_environ": {"MAIN": (environ.format(w=64), environ.format(w=128))},
    }


def test_lambdas_by_their_code_and_library_reads_in_memory(tmp_path: Path) -> None:
    # The key once held the lambdas' shared line and "<lambda>", and os.environ ended "by
    # name" at a library module: process 2 compiled nothing and loaded variant A's bytes.
    runs = _check(tmp_path, _round_two_cases())
    second = runs["second"]
    assert second["raw_two_lambdas_one_line"]["compiles"] >= 1, second
    for run in ("first", "second"):
        assert runs[run]["raw_os_environ"]["memory_only_compiles"] >= 1, runs[run]
        assert runs[run]["raw_os_environ"]["disk_hits"] == 0, runs[run]


_PATCHED_FA4 = """
import cutlass
import cutlass.cute as cute
import flash_attn.cute.mask as fa_mask
from identity_runner import fa4_forward

@cute.jit
def mask_mod(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
    return n_idx <= m_idx + 64

@cute.jit
def call_mask_mod(mask_mod: cutlass.Constexpr, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_data):
    # A hot-fix of FA4's shim: every query one block later.
    return mask_mod(batch_idx, head_idx, q_idx + 128, kv_idx, seqlen_info, aux_data.tensors)

def run():
    {patch}
    fa4_forward(mask_mod)
"""


def test_fa4_patched_at_run_time_is_compiled_in_memory(tmp_path: Path) -> None:
    # Process 1 runs FA4 as shipped; process 2 replaces flash_attn.cute.mask.call_mask_mod (a
    # hot-fix) and runs the same mask. FA4's files, which the toolchain id digests, are the
    # same: process 2 once loaded process 1's kernel, and a clean run of it filed other bytes
    # under the same key.
    cases = {
        "fa4_patched": {
            "MAIN": (
                _PATCHED_FA4.format(patch="pass"),
                _PATCHED_FA4.format(patch="fa_mask.call_mask_mod = call_mask_mod"),
            )
        }
    }
    runs = _check(tmp_path, cases)
    assert runs["first"]["fa4_patched"]["compiles"] == 1, runs["first"]
    for run in ("second", "own"):
        row = runs[run]["fa4_patched"]
        assert (row["disk_hits"], row["compiles"]) == (0, 0), row
        assert row["memory_only_compiles"] >= 1, row
        err = runs[run]["stderr"]
        assert "flash_attn.cute.mask.call_mask_mod" in err and "replaced at run time" in err, err[-3000:]
        assert err.count("replaced at run time") == 1, err[-3000:]


def test_a_patched_process_with_the_check_off_for_loads_stores_nothing(tmp_path: Path) -> None:
    # FA4CACHE_PATCH_CHECK=0 trusts the files for loads only: a patched process (variant B)
    # with it off still takes the verdict before it publishes, keeps its kernel in memory, and
    # a clean process on the same store then compiles its own (never B's).
    cases = {
        "fa4_patched_unchecked": {
            "MAIN": (
                _PATCHED_FA4.format(patch="pass"),
                _PATCHED_FA4.format(patch="fa_mask.call_mask_mod = call_mask_mod"),
            )
        }
    }
    names = sorted(cases)
    src, shared = tmp_path / "cases", tmp_path / "shared"
    _write(src, cases, 1)
    patched = _side_by_side(_start(src, shared, names, FA4CACHE_PATCH_CHECK="0"))[0]["fa4_patched_unchecked"]
    assert (patched["compiles"], patched["disk_hits"]) == (0, 0) and patched["memory_only_compiles"] >= 1, (
        patched
    )
    assert _entries(shared) == {}, "a patched process stored a kernel"
    _write(src, cases, 0)
    clean = _run(src, shared, names)["fa4_patched_unchecked"]
    assert (clean["compiles"], clean["disk_hits"]) == (1, 0), clean


_AHEAD_MASKS = """
import os
import sys

import cutlass.cute as cute

@cute.jit
def plain(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
    return n_idx <= m_idx

@cute.jit
def by_environ(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
    return n_idx <= m_idx + int(os.environ.get("FA4CACHE_T49_WINDOW", "64"))

@cute.jit
def by_sys_modules(b, h, m_idx, n_idx, seqlen_info, aux_tensors):
    return n_idx <= m_idx + sys.modules["ah49_cfg"].W
"""

_AHEAD_MAIN = """
import os
from identity_runner import fa4_forward_backward
import ah49_cfg
import ah49_masks as masks

def run():
    # The first forward's miss starts the compile server (compile-ahead): it was spawned
    # with the environment and modules as they are now.
    fa4_forward_backward(masks.plain)
    {late}
"""


def test_compile_ahead_never_compiles_a_window_set_after_the_server_started(tmp_path: Path) -> None:
    # Issue 49's last row: a window read through os.environ or sys.modules["cfg"].W, set by
    # the script after its compile server started. The server resolves a mask by name and
    # checks its key against the requester's; both keys once missed the value, and the
    # server's backward (window 64) was served to the process (window 128). Both reads keep
    # the kernels in memory now: the server is never asked, and the store holds nothing of them.
    late = {
        "ahead_environ": "os.environ['FA4CACHE_T49_WINDOW'] = '128'\n    fa4_forward_backward(masks.by_environ)",
        "ahead_sys_modules": "ah49_cfg.W = 128\n    fa4_forward_backward(masks.by_sys_modules)",
    }
    src, shared, clean = tmp_path / "cases", tmp_path / "shared", tmp_path / "clean"
    for name, text in late.items():
        files = {"ah49_masks.py": (_AHEAD_MASKS,) * 2, "ah49_cfg.py": ("W = 64\n",) * 2}
        _write(src, {name: {**files, "MAIN": (_AHEAD_MAIN.format(late=text),) * 2}}, 0)
        only_plain = {**files, "MAIN": (_AHEAD_MAIN.format(late="pass"),) * 2}
        _write(tmp_path / "plain", {name: only_plain}, 0)
    names = sorted(late)
    # The process with compile-ahead on (as by default), and the plain masks alone, ahead off.
    ahead, plain = _side_by_side(
        _start(src, shared, names, ahead=True), _start(tmp_path / "plain", clean, names[:1])
    )
    for name in names:
        # The late mask's forward and backward (the kernels that take a mask_mod).
        assert ahead[name]["memory_only_compiles"] >= 2, ahead[name]
    err = ahead["stderr"]
    assert "os.environ" in err and "sys.modules" in err, err[-3000:]
    # The store holds the plain masks' kernels (the server compiled their backward) and
    # nothing else: no kernel of the late masks, from the server or the process.
    have, want = _entries(shared), _entries(clean)
    assert have == want, f"other kernels in the store: {sorted(set(have) ^ set(want))}"
