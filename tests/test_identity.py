"""Code identity (fa4cache.identity) and what stands on it: FA4's sound callable hash, the
expect-warm mode, the recompile-storm warning and near-misses in words. Fast: no compile.

The end-to-end proof (two processes, one store, real kernels, the code changed in
between) is tests/test_identity_kernels.py; here each rule of the walker is held alone,
with modules written to disk and imported as user code is.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from fa4cache.errors import UnkeyableCode
from fa4cache.identity import current, identity, library_label


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write modules under tmp_path and import them fresh (``pkg(name, text)``)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, text: str) -> Any:
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        sys.modules.pop(name, None)
        written.append(name)
        importlib.invalidate_caches()
        return importlib.import_module(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_reads_through_globals_attributes_helpers_and_closures(pkg: Any) -> None:
    helpers = pkg("idh_helpers", "OFFSET = 3\ndef offset():\n    return OFFSET\n")
    cfg = pkg("idh_cfg", "WIDTH = 8\n")
    m = pkg(
        "idh_main",
        """
        import idh_helpers as helpers
        import idh_cfg as cfg
        WINDOW = 64
        def make(k):
            def mask(m, n):
                return n <= m + WINDOW + cfg.WIDTH + helpers.offset() + k
            return mask
        """,
    )
    fn = m.make(1)
    base = identity(fn)
    assert base.valid()
    changes = [
        (m, "WINDOW", 128),  # a global read by name
        (cfg, "WIDTH", 9),  # an attribute chain
        (helpers, "OFFSET", 4),  # a global of a helper in another module
    ]
    seen = {base.digest}
    for mod, name, value in changes:
        old = getattr(mod, name)
        setattr(mod, name, value)
        assert not base.valid(), f"{name} changed but the identity still holds"
        now = identity(fn).digest
        assert now not in seen, name
        seen.add(now)
        setattr(mod, name, old)
        assert identity(fn).digest == base.digest
    assert identity(m.make(2)).digest not in seen  # a closure cell, by value
    assert identity(m.make(1)).digest == base.digest  # a new closure of the same values


def test_a_helper_redefined_at_run_time_changes_the_identity(pkg: Any) -> None:
    helpers = pkg("idr_helpers", "def offset():\n    return 1\n")
    m = pkg("idr_main", "from idr_helpers import offset\ndef mask(m, n):\n    return n <= m + offset()\n")
    before = current(m.mask)
    m.offset = helpers.offset.__class__(
        compile("def offset():\n    return 2\n", str(Path(helpers.__file__)), "exec").co_consts[0],
        helpers.__dict__,
    )
    assert not before.valid()
    with pytest.raises(UnkeyableCode, match="changed on disk"):
        # Its code is not the file's: no source describes it.
        identity(m.mask)


def test_wrappers_no_source_and_lookups_by_string_change_the_key(pkg: Any) -> None:
    # An adversarial review's holes: each pair of variants once had one digest, and a second
    # process loaded the first one's kernel (proven with real FA4 compiles for the first).
    wrapper = """
        import functools
        def shift(fn):
            @functools.wraps(fn)
            def wrapper(b, h, q, kv, si, aux):
                return fn(b, h, q + {k}, kv, si, aux)
            return wrapper
        @shift
        def mask_mod(b, h, q, kv, si, aux):
            return kv <= q
        """
    by_class = """
        import functools
        class Shift:
            def __init__(self, fn, k):
                functools.update_wrapper(self, fn)
                self.k = k
            def __call__(self, b, h, q, kv, si, aux):
                return self.__wrapped__(b, h, q + self.k, kv, si, aux)
        def base(b, h, q, kv, si, aux):
            return kv <= q
        mask_mod = Shift(base, {k})
        """
    for n, text in enumerate((wrapper, by_class)):
        a, b = (identity(pkg(f"idw_{n}_{k}", text.format(k=k)).mask_mod).digest for k in (5, 6))
        assert a != b, n  # the wrapper's own code (functools.wraps), its attributes (a class)
    # No source file (exec, a notebook cell): the names the bytecode reads count too.
    exec_fns = []
    for attr in ("seqlen_q", "seqlen_k"):
        ns: dict[str, Any] = {}
        exec(f"def mask_mod(b, h, q, kv, si, aux):\n    return kv <= si.{attr}\n", ns)  # noqa: S102
        exec_fns.append(identity(ns["mask_mod"]).digest)
    assert exec_fns[0] != exec_fns[1]
    looks_up = pkg(
        "idw_globals", "OFF = 5\ndef mask_mod(b, h, q, kv, si, aux):\n    return kv <= q + globals()['OFF']\n"
    )
    with pytest.raises(UnkeyableCode, match="calls globals.*by name"):
        identity(looks_up.mask_mod)


def test_a_user_wrapper_does_not_borrow_the_wrapped_functions_explicit_key() -> None:
    from fa4cache.adapters.fa4.keys import base_hash

    class Shift:
        def __init__(self, fn: Any, k: int) -> None:
            self.__wrapped__, self.k = fn, k

        def __call__(self, *a: Any) -> Any:
            return self.__wrapped__(*a)

    def base(b: Any, h: Any, q: Any, kv: Any, si: Any, aux: Any) -> Any:
        return kv <= q

    base.__cute_hash__ = "my-mask-v1"  # type: ignore[attr-defined]
    assert base_hash(base) == "explicit:my-mask-v1"
    assert base_hash(Shift(base, 5)) != base_hash(Shift(base, 6))


def test_in_place_changes_of_the_root_and_of_class_attributes_are_seen(pkg: Any) -> None:
    m = pkg(
        "idm_main",
        """
        import functools
        class M:
            OFFS = [3]
            def __init__(self, k):
                self.k = k
            def __call__(self, b, h, q, kv, si, aux):
                return kv <= q + self.k + self.OFFS[0]
            def meth(self, b, h, q, kv, si, aux):
                return kv <= q + self.k
        def part(b, h, q, kv, si, aux, off):
            return kv <= q + off
        """,
    )
    obj, holder = m.M(5), m.M(5)
    partial = functools.partial(m.part, off=5)
    changes = [
        (obj, lambda: setattr(obj, "k", 6)),  # a mask object's attribute
        (obj, lambda: m.M.OFFS.__setitem__(0, 4)),  # a class attribute edited in place
        (holder.meth, lambda: setattr(holder, "k", 6)),  # a bound method's self
        (partial, lambda: partial.keywords.__setitem__("off", 6)),  # a partial's keywords
    ]
    for n, (fn, change) in enumerate(changes):
        before = current(fn)
        change()
        assert not before.valid(), n
        assert current(fn).digest == identity(fn).digest != before.digest, n


@pytest.mark.parametrize(
    ("helper", "kernel"),
    [
        # type(self).OFF on a metaclass defined in another module
        ("class Meta(type):\n    OFF = {k}\n",
         "from {h} import Meta\nclass M(metaclass=Meta):\n    def __call__(self, q, kv):\n        return kv <= q + type(self).OFF\nmask_mod = M()\n"),
        # a defaultdict's default factory
        ("def add(a, b):\n    return a + b\ndef sub(a, b):\n    return a - b - {k}\n",
         "import collections\nimport {h} as h\nOPS = collections.defaultdict(lambda: h.sub)\n"
         "def mask_mod(q, kv):\n    return OPS['mul'](kv, q)\n"),
        # a dict subclass's own lookup
        ("class D(dict):\n    def __getitem__(self, k):\n        return dict.__getitem__(self, k) + {k}\nT = D(a=1)\n",
         "from {h} import T\ndef mask_mod(q, kv):\n    return kv <= q + T['a']\n"),
        # a dataclass attribute set beside its fields, read by its method
        ("import dataclasses\n@dataclasses.dataclass\nclass C:\n    x: int\n    def off(self, q):\n        return q + self.extra\n"
         "CFG = C(1)\nCFG.extra = {k}\n",
         "from {h} import CFG\ndef mask_mod(q, kv):\n    return kv <= CFG.off(q)\n"),
    ],
)  # fmt: skip
def test_values_reached_through_classes_and_containers_change_the_key(
    tmp_path: Path, helper: str, kernel: str
) -> None:
    # A second adversarial pass: each pair once had one digest in two processes.
    digests = []
    for k in (5, 6):
        d = tmp_path / str(k)
        d.mkdir()
        (d / "idc_h.py").write_text(helper.format(k=k))
        (d / "idc_k.py").write_text(kernel.format(h="idc_h"))
        code = f"import sys; sys.path.insert(0, {str(d)!r}); import idc_k; from fa4cache.identity import identity; print(identity(idc_k.mask_mod).digest)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        digests.append(out.stdout.strip())
    assert digests[0] != digests[1]


def test_a_class_attribute_no_key_holds_makes_the_class_unkeyable(pkg: Any) -> None:
    # self.H.OFF, with H a user module: no chain follows self, so the value went unread.
    pkg("idu_h", "OFF = 5\n")
    m = pkg(
        "idu_k",
        "import idu_h\nclass M:\n    H = idu_h\n    def __call__(self, q, kv):\n        return kv <= q + self.H.OFF\n",
    )
    with pytest.raises(UnkeyableCode, match="M.H is the user module idu_h"):
        identity(m.M())


def test_in_place_changes_inside_containers_defaults_and_class_attribute_types(pkg: Any) -> None:
    m = pkg(
        "idp_main",
        """
        import dataclasses
        T = ([5],)
        @dataclasses.dataclass(frozen=True)
        class F:
            offs: list
        CFG = F([5])
        def in_tuple(q, kv):
            return kv <= q + T[0][0]
        def in_frozen(q, kv):
            return kv <= q + CFG.offs[0]
        def kw_default(q, kv, *, off=5):
            return kv <= q + off
        def list_default(q, kv, offs=[5]):
            return kv <= q + offs[0]
        class M:
            X = 1
            def __call__(self, q, kv):
                return kv <= q + self.X
        """,
    )
    obj = m.M()
    changes = [
        (m.in_tuple, lambda: m.T[0].__setitem__(0, 6)),
        (m.in_frozen, lambda: m.CFG.offs.__setitem__(0, 6)),
        (m.kw_default, lambda: m.kw_default.__kwdefaults__.__setitem__("off", 6)),
        (m.list_default, lambda: m.list_default.__defaults__[0].__setitem__(0, 6)),
        (obj, lambda: setattr(m.M, "X", 1.0)),  # equal, and another type to trace
    ]
    for n, (fn, change) in enumerate(changes):
        before = current(fn)
        change()
        assert not before.valid(), n
        assert current(fn).digest == identity(fn).digest != before.digest, n


def test_code_without_a_file_is_keyed_alike_under_any_hash_seed(tmp_path: Path) -> None:
    # A set literal in exec'd code is a frozenset constant: its repr's order follows the seed.
    code = (
        "from fa4cache.identity import identity\nns = {}\n"
        "exec(\"def mask_mod(q, kv):\\n    return kv in {'a', 'b', 'c', 'd', 'e'}\\n\", ns)\n"
        "print(identity(ns['mask_mod']).digest)\n"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            timeout=120,
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1 and "" not in outs, outs


def test_library_is_judged_by_files_not_by_name(pkg: Any) -> None:
    torchish = pkg("torchtitan_like", "def f():\n    return 1\n")
    assert library_label(torchish.__file__) is None  # a user module, whatever its name
    import cutlass.cute as cute

    assert (library_label(cute.__file__) or "").startswith("nvidia-cutlass-dsl")
    assert library_label(os.__file__) == f"stdlib-cp{sys.version_info[0]}{sys.version_info[1]}"
    import fa4cache

    assert library_label(fa4cache.__file__) is None  # fa4cache's own masks are followed


def test_objects_are_keyed_by_value_or_refused_with_the_fix(pkg: Any) -> None:
    m = pkg(
        "ido_main",
        """
        from dataclasses import dataclass
        import threading
        class Band:
            def __init__(self, w):
                self.w = w
                self.lock = threading.Lock()
            def __repr__(self):
                return "Band()"
        class Plain:
            def __init__(self, w):
                self.w = w
            def get(self):
                return self.w
        @dataclass(frozen=True)
        class Cfg:
            w: int
            def width(self):
                return self.w * 2
        def by_attr(band):
            def mask(m, n):
                return n <= m + band.w
            return mask
        def by_object(band):
            def mask(m, n):
                return n <= m + len([band])
            return mask
        def by_config(cfg):
            def mask(m, n):
                return n <= m + cfg.width()
            return mask
        def by_method(f):
            def mask(m, n):
                return n <= m + f()
            return mask
        """,
    )
    # An attribute read of an object with a constant repr: keyed by the attribute's value.
    assert identity(m.by_attr(m.Band(1))).digest != identity(m.by_attr(m.Band(2))).digest
    # The object itself, used as a whole: no key, and the message says what to do.
    with pytest.raises(
        UnkeyableCode, match=r"band\.lock is a _thread\.lock.*read by ido_main.*Fix:.*aux tensor"
    ):
        identity(m.by_object(m.Band(1)))
    # A frozen dataclass: by type (its methods' source) and fields; a bound method: by both.
    assert identity(m.by_config(m.Cfg(1))).digest != identity(m.by_config(m.Cfg(2))).digest
    assert identity(m.by_method(m.Cfg(1).width)).digest != identity(m.by_method(m.Cfg(2).width)).digest
    # A plain object: by its class and attributes, re-checked (it can change in place).
    plain = m.Plain(1)
    ident = identity(m.by_method(plain.get))
    assert ident.digest != identity(m.by_method(m.Plain(2).get)).digest
    plain.w = 2
    assert not ident.valid()
    torch = pytest.importorskip("torch")
    with pytest.raises(UnkeyableCode, match="tensor"):
        identity(m.by_attr(m.Band(torch.zeros(2))))
    band = m.Band(1)
    band.__fa4cache_key__ = "band-v1"  # an explicit key for what fa4cache cannot value
    assert identity(m.by_object(band)).digest == identity(m.by_object(band)).digest


def test_defaults_nested_functions_and_packages(pkg: Any) -> None:
    pkg("idn_pkg.__init__", "")
    inner = pkg("idn_pkg.inner", "SCALE = 2\ndef scale():\n    return SCALE\n")
    m = pkg(
        "idn_main",
        """
        from idn_pkg.inner import scale
        def mask(m, n, w=4):
            def inner(x):
                return x + scale()
            return n <= inner(m) + w
        """,
    )
    before = identity(m.mask).digest
    m.mask.__defaults__ = (5,)
    assert identity(m.mask).digest != before
    m.mask.__defaults__ = (4,)
    inner.SCALE = 3  # read by a function the nested function calls, in a nested package
    assert identity(m.mask).digest != before


def test_an_edited_file_makes_the_code_unkeyable_until_reloaded(pkg: Any, tmp_path: Path) -> None:
    m = pkg("ide_main", "def mask(m, n):\n    return n <= m + 1\n")
    assert identity(m.mask).digest
    path = Path(m.__file__)
    path.write_text("def mask(m, n):\n    return n <= m + 2\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(UnkeyableCode, match="changed on disk since it was imported"):
        identity(m.mask)


def test_digests_agree_across_processes_and_hash_seeds(pkg: Any, tmp_path: Path) -> None:
    import subprocess

    pkg(
        "idp_main",
        "import math\nK = (1, 'a', 2.5)\ndef mask(m, n):\n    return n <= m + K[0] + math.floor(0.5)\n",
    )
    code = "import idp_main; from fa4cache.identity import identity; print(identity(idp_main.mask).digest)"
    outs = set()
    for seed in ("0", "7"):
        env = {
            **os.environ,
            "PYTHONHASHSEED": seed,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        }
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        outs.add(p.stdout.strip())
    assert len(outs) == 1


# --------------------------------------------------------------------------- FA4's hash


def test_fa4_hash_is_sound_and_honours_explicit_keys(pkg: Any, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("flash_attn.cute")
    from fa4cache.adapters.fa4.keys import base_hash, hash_callable
    from flash_attn.cute import utils

    from fa4cache.identity import MEMORY_ONLY

    m = pkg(
        "idf_main",
        """
        import threading
        WINDOW = 64
        class O:
            def __init__(self):
                self.lock = threading.Lock()
            def __repr__(self):
                return "O()"
        def mask(b, h, m, n, s, a):
            return n <= m + WINDOW
        def opaque(o):
            def mask(b, h, m, n, s, a):
                return n <= m + len([o])
            return mask
        """,
    )
    theirs = utils._compute_base_hash(m.mask)
    first = hash_callable(m.mask)
    m.WINDOW = 128
    assert utils._compute_base_hash(m.mask) == theirs  # FA4's own hash cannot see it
    assert hash_callable(m.mask) != first
    # FA4's own memo (__cute_hash__ written by its hash_callable) is not an explicit key...
    m.mask.__cute_hash__ = utils._compute_base_hash(m.mask)
    assert base_hash(m.mask).startswith("fa4cache:")
    # ...but a key the user chose is trusted, as FA4 documents.
    m.mask.__cute_hash__ = "window-128"
    assert base_hash(m.mask) == "explicit:window-128"
    with caplog.at_level(logging.WARNING, logger="fa4cache"):
        a, b = hash_callable(m.opaque(m.O())), hash_callable(m.opaque(m.O()))
    assert a.startswith(MEMORY_ONLY) and b.startswith(MEMORY_ONLY) and a != b
    assert caplog.text.count("compiled in memory only") == 1, caplog.text


def test_library_closures_are_keyed_by_what_they_captured() -> None:
    # FA4's softcap score_mod is library code (the fingerprint covers its source), but the
    # softcap it captured is a value: 30 and 50 are two kernels. (Seen wrong on the H200.)
    pytest.importorskip("flash_attn.cute")
    from fa4cache.adapters.fa4.keys import hash_callable
    from flash_attn.cute.utils import create_softcap_scoremod

    assert hash_callable(create_softcap_scoremod(30.0)) != hash_callable(create_softcap_scoremod(50.0))
    assert hash_callable(create_softcap_scoremod(30.0)) == hash_callable(create_softcap_scoremod(30.0))


def test_memory_only_keys_never_reach_the_store(tmp_path: Path) -> None:
    from fa4cache.adapters.fa4.compile_cache import StoreCompileCache

    from fa4cache.identity import MEMORY_ONLY
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeCompiled, installation

    store = Store.at(tmp_path / "s")
    cache = StoreCompileCache("fwd", installation(store))
    key = (1, f"{MEMORY_ONLY}7")
    assert key not in cache
    cache[key] = FakeCompiled(1)
    assert key in cache
    store.counters.flush()
    assert store.counters.values["memory_only_compiles"] == 1
    assert store.counters.values["compiles"] == 0
    assert not list((tmp_path / "s").rglob("*.o"))


# --------------------------------------------------------------------------- warm-up checks


def test_expect_warm_warns_or_raises_naming_the_kernel_and_the_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fa4cache
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeFA4

    store = Store.at(tmp_path / "s")
    fa = FakeFA4(store, "fwd")
    fa.call(7, 0)
    with caplog.at_level(logging.WARNING, logger="fa4cache"), fa4cache.expect_warm():
        fa.call(7, 0)  # warm: nothing said
        assert "after warm-up" not in caplog.text
        fa.call(8, 0)
    assert (
        "a fwd kernel compiles after warm-up" in caplog.text and "'8' here, '7' in this store" in caplog.text
    )
    with fa4cache.expect_warm("error"), pytest.raises(fa4cache.UnexpectedCompile, match="fwd"):
        fa.call(9, 0)
    fa.call(9, 0)  # the lock was released: outside the block it compiles
    monkeypatch.setenv("FA4CACHE_EXPECT_WARM", "error")
    with pytest.raises(fa4cache.UnexpectedCompile):
        fa.call(10, 0)
    with pytest.raises(ValueError, match="on_compile"), fa4cache.expect_warm("loud"):
        pass


def test_a_field_that_changes_every_call_is_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fa4cache import warmth
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeCompiled, FakeFA4

    warmth._storm_state.clear()
    store = Store.at(tmp_path / "s")
    fa = FakeFA4(store, "bwd")
    with caplog.at_level(logging.WARNING, logger="fa4cache"):
        for n in range(6):
            key = (128, "bf16", 1000 + n)  # the third field changes every call
            if key not in fa.cache:
                fa.cache[key] = FakeCompiled(n)
    assert caplog.text.count("compiled 3 times in a row, each time with another [2]") == 1, caplog.text


def test_near_misses_name_fa4s_key_fields() -> None:
    pytest.importorskip("flash_attn.cute")
    from fa4cache.adapters.fa4.key_names import field_names

    from fa4cache.store.nearmiss import _field

    names = field_names("fwd", len(field_names("fwd", 64) or ()))
    assert names is not None and "mask_mod_hash" in names and "head_dim" in names
    i = names.index("mask_mod_hash")
    assert _field(f"[{i}]", names) == "mask_mod_hash"
    assert _field("[3].i", names) == names[3]


def test_a_miss_reads_fa4s_key_names_only_when_a_message_names_a_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Reading FA4's source for its key names cost a process's first miss (a compile server
    # child's too) 10-30 ms before its compile: a miss with nothing to say never reads it.
    from fa4cache.adapters.fa4 import key_names

    from fa4cache import warmth
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeCompiled, FakeFA4

    reads: list[bool] = []
    monkeypatch.setattr(
        key_names, "_tables", lambda: reads.append(True) or {"bwd": [("head_dim", "dtype", "seqlen")]}
    )
    warmth._storm_state.clear()
    fa = FakeFA4(Store.at(tmp_path / "s"), "bwd")
    with caplog.at_level(logging.INFO, logger="fa4cache"):
        assert (128, "bf16", 1000) not in fa.cache  # a first miss, on an empty store
        fa.cache[(128, "bf16", 1000)] = FakeCompiled(0)
        assert reads == [] and "miss:" not in caplog.text
        assert (128, "bf16", 1001) not in fa.cache  # a near miss: its line names the field
    assert reads == [True] and "differs in seqlen" in caplog.text, caplog.text
    fa.cache[(128, "bf16", 1001)] = FakeCompiled(1)
    with caplog.at_level(logging.WARNING, logger="fa4cache"):  # a line nobody would see:
        assert (64, "bf16", 1001) not in fa.cache  # neither the names nor the stored keys read
    assert reads == [True] and "miss: the closest key" not in caplog.text.split("differs in seqlen")[-1]


@pytest.mark.compile
def test_warm_compiles_on_purpose_even_when_the_job_expects_warm(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    args = ("warm", "--mask", "causal", "--no-backward", "--head-dim", "64")
    for jobs in ("1", "2"):  # in the process, and in compile workers
        p = run_cli(tmp_path / f"s{jobs}", *args, "-j", jobs, env={"FA4CACHE_EXPECT_WARM": "error"})
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        assert "after warm-up" not in p.stderr and "miss:" not in p.stderr, p.stderr[-3000:]
