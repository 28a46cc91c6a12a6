"""``@fa4cache.jit_cache`` and QuACK's kernels in the store: real cross-compiles for sm_90
on the CPU, in real processes (tests/helpers/jit_worker.py)."""

from __future__ import annotations

import dataclasses
import enum
import getpass
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fa4cache
from fa4cache.errors import UnkeyableCode
from tests.conftest import ROOT, once_per_run, worker_env


def _start(cache_dir: Path, action: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.jit_worker", action, *args],
        cwd=ROOT,
        env=worker_env(cache_dir, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-4000:]}"
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"worker printed no result:\n{out[-2000:]}\n{err[-2000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


# --------------------------------------------------------------------------- QuACK

QUACK_KINDS = (
    "quack.rmsnorm_fwd",
    "quack.rmsnorm_bwd",
    "quack.cross_entropy",
    "quack.cross_entropy_backward",
)


@pytest.fixture(scope="session")
def quack_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two processes, one after the other, running QuACK's RMSNorm forward/backward and
    cross-entropy forward/backward keys with fa4cache installed; QuACK's own cache
    directory and TMPDIR point at empty directories of the test. Once per run."""

    def build(d: Path) -> dict[str, Any]:
        store, private, tmp = d / "store", d / "quack_private", d / "tmp"
        tmp.mkdir()
        env = {"QUACK_CACHE_DIR": str(private), "TMPDIR": str(tmp)}
        first = _finish(_start(store, "quack", **env))
        # The second process is `warm --with-quack` for that model's sizes (through the public
        # functions, without FA4's specs): it must find every kernel the first one compiled.
        warm = subprocess.run(
            [sys.executable, "-c", WARM_QUACK],
            cwd=ROOT,
            env=worker_env(store, **env),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert warm.returncode == 0, warm.stderr[-4000:]
        return {"first": first, "warm": json.loads(warm.stdout.splitlines()[-1])}

    d, runs = once_per_run(tmp_path_factory, "quack_runs", build)
    return {"store": d / "store", "private": d / "quack_private", "tmp": d / "tmp", **runs}


WARM_QUACK = """
import json, os
import fa4cache
from fa4cache.adapters.compile.warm_jit_calls import quack_calls
from tests.helpers.jit_worker import HIDDEN, VOCAB, T_HINT
rs = fa4cache.warm(quack_calls(HIDDEN, VOCAB, ["bf16"], [T_HINT - 5]), os.environ["FA4CACHE_DIR"]).rows
print(json.dumps([[r.label, r.compiled, r.present, r.error] for r in rs]))
"""


@pytest.mark.compile
def test_quack_kernels_compile_once_then_a_second_process_loads_them(quack_runs: dict[str, Any]) -> None:
    first = quack_runs["first"]["kinds"]
    assert set(first) == set(QUACK_KINDS)
    for kind in QUACK_KINDS:
        assert first[kind] == {"compiles": 1, "disk_hits": 0}, kind
    # uninstall() gives QuACK its own wrappers back, with the kernels compiled meanwhile.
    assert quack_runs["first"]["restored"]
    warmed = quack_runs["warm"]
    assert len(warmed) == len(QUACK_KINDS)
    for label, compiles, present, error in warmed:
        assert error is None, (label, error)
        assert (compiles, present) == (0, 1), f"warm's key for {label} is not the one the step compiled"


@pytest.mark.compile
def test_quack_kinds_in_stats_and_private_cache_untouched(quack_runs: dict[str, Any]) -> None:
    st = fa4cache.stats(quack_runs["store"])
    for kind in QUACK_KINDS:
        v = st["by_kind"][kind]
        assert (v["entries"], v["compiles"], v["disk_hits"]) == (1, 1, 1), (kind, v)
        # The first process called each kernel twice: the second call was a memory hit.
        assert v["memory_hits"] == 1, (kind, v)
    assert st["compiles"] == len(QUACK_KINDS)
    # QUACK_CACHE_DIR and QuACK's default ($TMPDIR/<user>/quack_cache) were never written.
    assert not quack_runs["private"].exists()
    assert not (quack_runs["tmp"] / getpass.getuser() / "quack_cache").exists()
    assert not list(quack_runs["tmp"].rglob("*quack*"))  # (CUTLASS and torch keep their caches there)


@pytest.mark.compile
def test_quack_async_pool_compiles_into_the_store(tmp_path: Path) -> None:
    """With QuACK's compile pool active, the miss goes to a pool worker (CompilePending until
    it is done), which compiles into the store; the caller then loads it; QuACK's directory
    stays empty."""
    env = {"QUACK_CACHE_DIR": str(tmp_path / "quack_private"), "QUACK_ASYNC_COMPILE_START": "spawn"}
    r = _finish(_start(tmp_path / "store", "pool", QUACK_COMPILE_WORKERS="1", **env))
    assert r["submitted"] == 1 and r["pending"] >= 1, r
    assert (r["compiles"], r["disk_hits"]) == (0, 1), r  # compiled by the worker, loaded here
    st = fa4cache.stats(tmp_path / "store")["by_kind"]["quack.rmsnorm_fwd"]
    assert (st["entries"], st["compiles"]) == (1, 1)
    assert not (tmp_path / "quack_private").exists()


def _fake_compile(n: int) -> object:
    return object()


def test_routed_quack_wrapper_defers_to_quack_while_routing_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference to a routed wrapper kept past uninstall() hands misses to QuACK's own
    wrapper; while routing is on, they are fa4cache's (memory only here: FA4CACHE_DISABLE)."""
    pytest.importorskip("quack")
    import quack.cache as qc
    from fa4cache.adapters.jit import quack as adapter
    from quack.cache.jit import jit_cache as quack_jit_cache

    monkeypatch.setattr(qc, "CACHE_ENABLED", False)  # QuACK's wrapper: memory only
    monkeypatch.setenv("FA4CACHE_DISABLE", "1")
    original = quack_jit_cache(_fake_compile)
    routed = adapter._route(original, adapter._wrapper_code())
    assert routed is not None and adapter._route(original, adapter._wrapper_code()) is routed
    assert adapter._route(_fake_compile, adapter._wrapper_code()) is None
    state = routed.__fa4cache_jit__
    monkeypatch.setattr(adapter, "_enabled", True)
    k1 = routed(1)
    assert (state.misses, original.cache_info().misses) == (1, 0)
    monkeypatch.setattr(adapter, "_enabled", False)
    k2 = routed(2)
    assert (state.misses, original.cache_info().misses) == (1, 1)
    assert original(1) is k1 and routed(2) is k2  # one dict, shared


def test_quack_token_buckets_match_quack() -> None:
    pytest.importorskip("quack")
    from fa4cache.adapters.compile.warm_jit_calls import bucket_tokens
    from quack.rmsnorm import _bucket_T_hint

    rng = random.Random(int(os.environ["FA4CACHE_FUZZ_SEED"]))
    for t in [0, 1, 2, 3, 4096, 4097] + [rng.randrange(1, 1 << 22) for _ in range(500)]:
        assert bucket_tokens(t) == _bucket_T_hint(t), t


def test_warm_arguments_name_the_quack_calls(tmp_path: Path) -> None:
    from fa4cache.cli import build_parser
    from fa4cache.cli.warm_jit import calls_from_args
    from fa4cache.errors import ConfigError

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 3072, "vocab_size": 128256, "num_attention_heads": 24}))
    p = build_parser()
    args = p.parse_args(
        [
            "warm",
            "--hf-config",
            str(cfg),
            "--with-quack",
            "--tokens",
            "3000",
            "--tokens",
            "4000",
            "--dtype",
            "fp16",
        ]
    )
    labels = [c.label() for c in calls_from_args(args)]
    assert labels == [
        "rmsnorm fwd fp16 N=3072",
        "rmsnorm bwd fp16 N=3072 T~4096",  # 3000 and 4000 share QuACK's power-of-2 bucket
        "cross_entropy fwd fp16 V=128256",
        "cross_entropy bwd fp16 V=128256",
    ]
    assert calls_from_args(p.parse_args(["warm", "--hf-config", str(cfg)])) == []
    with pytest.raises(ConfigError, match="--with-quack"):
        calls_from_args(p.parse_args(["warm", "--with-quack"]))


@pytest.mark.compile
def test_warm_manifest_names_jit_cache_functions(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(
        json.dumps(
            [
                {
                    "jit": "tests.helpers.jit_kernels:compile_scale",
                    "args": [{"type": "cutlass.Float16"}],
                    "kwargs": {"align": 8},
                },
                {"jit": "tests.helpers.jit_kernels:_launch", "args": []},  # not a jit_cache function: refused
            ]
        )
    )
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "fa4cache", "--cache-dir", str(store), "warm", "--manifest", str(manifest)]
    runs = [subprocess.run(cmd, cwd=ROOT, env=worker_env(store), capture_output=True, text=True, timeout=600)]
    runs.append(
        subprocess.run(cmd, cwd=ROOT, env=worker_env(store), capture_output=True, text=True, timeout=600)
    )
    for r, compiled in zip(runs, (1, 0)):
        assert r.returncode == 1, r.stderr[-3000:]  # the refused entry fails the run
        # warm's one table: item, compiled, present, compile s, wall s, status
        row = re.search(
            r"^compile_scale\(Float16, align=8\)\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s+ok$", r.stdout, re.M
        )
        assert row, r.stdout
        assert (int(row[1]), int(row[2])) == (compiled, 1 - compiled)
        assert re.search(
            r"^_launch\(\).*FAILED: ConfigError: jit: .* is not a @fa4cache.jit_cache", r.stdout, re.M
        )
    st = fa4cache.stats(store)["by_kind"]["jit.compile_scale"]
    # The second warm found it present: warm's own lookup, not a job's disk hit.
    assert (st["entries"], st["compiles"], st["disk_hits"]) == (1, 1, 0)


# --------------------------------------------------------------------------- user kernels


@pytest.mark.compile
def test_user_kernel_compiles_once_across_four_processes_and_again_when_a_constant_changes(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(4)]
    procs = [_start(store, "user", "--ready", str(r), "--go", str(go)) for r in ready]
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a worker exited before lining up"
        time.sleep(0.05)
    go.touch()  # all four call compile_scale(Float32) together
    results = [_finish(p) for p in procs]
    assert sum(r["compiles"] for r in results) == 1, results
    assert sum(r["disk_hits"] for r in results) == 3, results
    assert all(r["same"] for r in results), "another spelling of the same call was not a memory hit"
    assert all(r["store"] == r["expected_store"] for r in results)
    st = fa4cache.stats(store)["by_kind"]["jit.compile_scale"]
    assert (st["entries"], st["compiles"]) == (1, 1)

    # A module constant the kernel reads (SCALE) changes: a new entry, compiled once.
    changed = _finish(_start(store, "user", FA4CACHE_TEST_SCALE="3.0"))
    assert (changed["compiles"], changed["disk_hits"]) == (1, 0)
    st = fa4cache.stats(store)["by_kind"]["jit.compile_scale"]
    assert (st["entries"], st["compiles"]) == (2, 2)


# --------------------------------------------------------------------------- keys (no compile)


@pytest.fixture(scope="module")
def kernels() -> Any:
    pytest.importorskip("cutlass")
    from tests.helpers import jit_kernels

    return jit_kernels


class Opt(enum.Enum):
    A = 1
    B = 2


@dataclasses.dataclass(frozen=True)
class Config:
    tile: int = 128
    stages: int = 2


def test_an_argument_no_key_can_value_is_named_and_kept_in_memory(kernels: Any, tmp_path: Path) -> None:
    # Arguments are valued like the globals a kernel reads (issue 49): a callable by its code,
    # a set by its items; what the walker cannot value makes the call memory-only, naming
    # the argument (the miss path compiles it without a store key).
    fn = kernels.compile_scale
    st = fn.__fa4cache_jit__
    for bad in (object(), bytearray(b"x"), threading.Lock()):
        with pytest.raises(UnkeyableCode, match="argument 'tag'"):
            st.canonical((kernels.DTYPES[0], 16, bad), {})
    assert st.misses == 0  # nothing was compiled
    one, two = (st.canonical((kernels.DTYPES[0], 16, f), {}) for f in (lambda: 1, lambda: 2))
    assert one != two  # two lambdas: two codes
    assert st.canonical((kernels.DTYPES[0], 16, {1, 2}), {}) != st.canonical(
        (kernels.DTYPES[0], 16, {1, 3}), {}
    )


def test_keys_are_canonical_over_spellings_and_distinct_over_values(kernels: Any) -> None:
    """Random calls: every spelling of one call (positional, keyword, defaults written out)
    names one entry; different argument values never share one."""
    seed = int(os.environ["FA4CACHE_FUZZ_SEED"])
    rng = random.Random(seed)
    print(f"seed {seed}")
    st = kernels.compile_scale.__fa4cache_jit__
    values = [None, True, False, 0, 1, -1, 2**40, 0.5, -0.0, 0.0, "x", "", (1, 2), (1, (2,)), Opt.A, Opt.B]
    values += [Config(), Config(64), Config(128, 3)]
    seen: dict[str, Any] = {}
    for _ in range(200):
        dtype = rng.choice(kernels.DTYPES)
        align = rng.choice([4, 8, 16])
        tag = rng.choice(values)
        spellings = [
            ((dtype, align, tag), {}),
            ((dtype,), {"align": align, "tag": tag}),
            ((), {"tag": tag, "dtype": dtype, "align": align}),
        ]
        if align == 16:
            spellings.append(((dtype,), {"tag": tag}))
        digests = {st.entry(st.canonical(a, k)).digest for a, k in spellings}
        assert len(digests) == 1, (dtype, align, tag)
        digest = digests.pop()
        value = (dtype, align, repr(tag), type(tag))
        assert seen.setdefault(digest, value) == value, f"{value} and {seen[digest]} share an entry"
    assert len(seen) > 50


def test_identity_follows_what_the_kernel_reads(kernels: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    st = kernels.compile_scale.__fa4cache_jit__
    before = st.entry(st.canonical((kernels.DTYPES[0],), {}))
    monkeypatch.setattr(kernels, "SCALE", kernels.SCALE + 1)
    after = st.entry(st.canonical((kernels.DTYPES[0],), {}))  # no memo outlives the change
    monkeypatch.undo()
    assert before.digest != after.digest
    assert st.entry(st.canonical((kernels.DTYPES[0],), {})) == before
    assert before.kind == "jit.compile_scale"


_TILE = 128


class _Kernel:
    """A kernel class as QuACK writes them: the compile function reads the class, the class's
    methods read module constants."""

    def __init__(self, n: int) -> None:
        self.n = n

    def tiles(self) -> int:
        return self.n // _TILE


def _compile_kernel(n: int) -> int:
    return _Kernel(n).tiles()


def test_identity_follows_kernel_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    from fa4cache.identity import identity

    before = identity(_compile_kernel).digest
    monkeypatch.setattr(sys.modules[__name__], "_TILE", 64)
    assert identity(_compile_kernel).digest != before
    monkeypatch.undo()
    assert identity(_compile_kernel).digest == before


def test_kind_names() -> None:
    from fa4cache.adapters.jit.jit_cache import kind_for, user_kind

    from fa4cache.store.paths import EntryRef

    assert kind_for("quack.", "_compile_rmsnorm_fwd") == "quack.rmsnorm_fwd"
    assert kind_for("quack.", "CrossEntropyBackward.compile") == "quack.cross_entropy_backward"
    assert kind_for("quack.", "f.<locals>.Inner.compile") == "quack.f_inner"
    assert user_kind("compile_scale") == "jit.compile_scale"
    assert user_kind("f.<locals>.RowSum.compile") == "jit.f.row_sum.compile"
    assert user_kind("Ünïcode") == "jit.n_code"
    for name in ("x" * 200, "a." * 100):
        assert len(user_kind(name)) == 64
        EntryRef("0" * 20, user_kind(name), "0" * 64)  # a valid kind


@pytest.mark.parametrize("kind", [".", "..", ".hidden", "a/b", "a\\b", "Quack.x", "x" * 65, ""])
def test_dotted_kinds_never_name_another_directory(kind: str) -> None:
    from fa4cache.errors import ConfigError
    from fa4cache.store.paths import EntryRef

    with pytest.raises(ConfigError, match="invalid kernel kind"):
        EntryRef("0" * 20, kind, "0" * 64)
    assert EntryRef("0" * 20, "quack.rmsnorm_fwd", "0" * 64).kind == "quack.rmsnorm_fwd"
