"""What a jit_cache call costs (CPU): fa4cache's wrappers vs QuACK's own ``jit_cache``.

* In-memory hit (the per-step path): QuACK's RMSNorm forward key (12 positional
  arguments), its backward key (3 keyword arguments) and a user kernel, called through
  QuACK's own wrapper and through fa4cache's (the routed QuACK wrapper after
  ``fa4cache.install()``, ``@fa4cache.jit_cache`` for the user kernel). Same process,
  same key, same dict contents; interleaved rounds, the best of each.
* Load from disk (a new process's first call): QuACK's ``.o`` vs the store's verified
  entry, after forgetting the kernel in memory.

Kernels are real cross-compiles for sm_90.    python benchmarks/bench_jit_cache.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
_tmp = Path(tempfile.mkdtemp(prefix="bench_jit_"))
os.environ["QUACK_CACHE_DIR"] = str(_tmp / "quack")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import warnings  # noqa: I001

warnings.filterwarnings("ignore")
from common import save, table

import fa4cache


def per_call_ns(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args, **kwargs)
    return (time.perf_counter_ns() - t0) / n


def main() -> None:
    import cutlass
    import quack  # noqa: F401
    from quack.cache.jit import jit_cache as quack_jit_cache

    from tests import jit_kernels

    rn = sys.modules["quack.rmsnorm"]
    bf = cutlass.BFloat16
    fwd_args = (bf, bf, None, bf, None, None, 4096, True, False, False, False, 0.0)
    bwd_args = (4096, bf, bf, bf, bf, False, None, None, True, False)
    bwd_kwargs = {"T_hint": 4096, "is_layernorm": False, "weight_offset": 0.0}
    quack_fwd, quack_bwd = rn._compile_rmsnorm_fwd, rn._compile_rmsnorm_bwd
    quack_user = quack_jit_cache(jit_kernels.compile_scale.__wrapped__)
    ours_user = jit_kernels.compile_scale

    # QuACK's own wrappers compile and write their .o files ...
    for fn, a, k in (
        (quack_fwd, fwd_args, {}),
        (quack_bwd, bwd_args, bwd_kwargs),
        (quack_user, (cutlass.Float32,), {}),
    ):
        fn(*a, **k)
    # ... then fa4cache's, into the store (the routed wrappers share QuACK's dicts: clear them first).
    fa4cache.install(_tmp / "store")
    ours_fwd, ours_bwd = rn._compile_rmsnorm_fwd, rn._compile_rmsnorm_bwd
    assert ours_fwd is not quack_fwd and hasattr(ours_fwd, "__fa4cache_jit__")
    for fn, a, k in (
        (ours_fwd, fwd_args, {}),
        (ours_bwd, bwd_args, bwd_kwargs),
        (ours_user, (cutlass.Float32,), {}),
    ):
        fn.cache_clear()
        fn(*a, **k)
    quack_fwd(*fwd_args)  # the shared dicts hold the kernels again
    quack_bwd(*bwd_args, **bwd_kwargs)

    cases = [
        ("QuACK rmsnorm fwd key (12 positional)", quack_fwd, ours_fwd, fwd_args, {}),
        ("QuACK rmsnorm bwd key (10 positional + 3 keyword)", quack_bwd, ours_bwd, bwd_args, bwd_kwargs),
        ("user kernel (1 positional)", quack_user, ours_user, (cutlass.Float32,), {}),
    ]
    n, rounds = 200_000, 7
    rows, data = [], {"hit": [], "load": []}
    for label, theirs, ours, a, k in cases:
        assert theirs(*a, **k) is ours(*a, **k) or label.startswith("user")
        t, o = [], []
        for _ in range(rounds):  # interleaved: both see the same machine load
            t.append(per_call_ns(theirs, a, k, n))
            o.append(per_call_ns(ours, a, k, n))
        rows.append([label, min(t), min(o), min(o) / min(t)])
        data["hit"].append(
            {"case": label, "quack_ns": min(t), "fa4cache_ns": min(o), "ratio": min(o) / min(t)}
        )
    hit_table = table(["call (in-memory hit)", "QuACK ns", "fa4cache ns", "fa4cache / QuACK"], rows)

    load_rows = []
    for label, theirs, ours, a, k in cases:
        t, o = [], []
        for _ in range(15):
            for fn, acc in ((theirs, t), (ours, o)):
                fn.cache_clear()
                t0 = time.perf_counter()
                fn(*a, **k)
                acc.append((time.perf_counter() - t0) * 1e3)
        assert ours.cache_info().misses == 1, "a load compiled"
        load_rows.append(
            [label, statistics.median(t), statistics.median(o), statistics.median(o) / statistics.median(t)]
        )
        data["load"].append(
            {"case": label, "quack_ms": statistics.median(t), "fa4cache_ms": statistics.median(o)}
        )
    load_table = table(["call (load from disk)", "QuACK ms", "fa4cache ms", "fa4cache / QuACK"], load_rows)
    save(
        "jit_cache_cpu",
        "jit_cache calls: fa4cache vs QuACK's own jit_cache (CPU, cross-compiled sm_90 kernels)",
        [
            (f"In-memory hit, ns per call (best of {rounds} interleaved rounds of {n:,} calls)", hit_table),
            ("Load from disk after forgetting the kernel in memory, ms (median of 15)", load_table),
        ],
        data,
    )


if __name__ == "__main__":
    main()
