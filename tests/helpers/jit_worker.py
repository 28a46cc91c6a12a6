"""A real process compiling CuTe-DSL kernels through ``fa4cache.jit_cache`` / QuACK's
routed ``jit_cache``; tests run it as a subprocess. Prints one ``RESULT`` JSON line.

Usage: python -m tests.helpers.jit_worker quack|user|pool [--ready FILE --go FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Cross-compile for an H200 on the CPU.
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")

# The QuACK keys a bf16 training step with hidden size 4096 and a 32000-token vocabulary
# runs (rmsnorm forward with rstd, its backward, cross-entropy forward with lse, its backward).
HIDDEN, VOCAB, T_HINT = 4096, 32000, 4096


def quack_calls() -> dict[str, tuple[object, tuple, dict]]:
    from cutlass import BFloat16, Int64

    rn = sys.modules["quack.rmsnorm"]
    ce = sys.modules["quack.cross_entropy"]
    bf = BFloat16
    return {
        "quack.rmsnorm_fwd": (
            rn._compile_rmsnorm_fwd,
            (bf, bf, None, bf, None, None, HIDDEN, True, False, False, False, 0.0),
            {},
        ),
        "quack.rmsnorm_bwd": (
            rn._compile_rmsnorm_bwd,
            (HIDDEN, bf, bf, bf, bf, False, None, None, True, False),
            {"T_hint": T_HINT, "is_layernorm": False, "weight_offset": 0.0},
        ),
        "quack.cross_entropy": (
            ce.CrossEntropy.compile,
            (bf, Int64, None, VOCAB, True, False, None, None),
            {},
        ),
        "quack.cross_entropy_backward": (ce.CrossEntropyBackward.compile, (bf, Int64, VOCAB, None), {}),
    }


def _line_up(ready: str | None, go: str | None) -> None:
    if ready:
        Path(ready).touch()
    if go:
        deadline = time.monotonic() + 300
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["quack", "user", "pool"])
    p.add_argument("--ready")
    p.add_argument("--go")
    a = p.parse_args()

    import fa4cache

    if a.action == "quack":
        store = fa4cache.install()
        import quack  # noqa: F401  (patched as it is imported)

        originals = {}
        out = {}
        for kind, (fn, args, kwargs) in quack_calls().items():
            originals[kind] = fn.__fa4cache_quack_original__
            c0 = dict(store.counters.by_kind.get(kind, {}))
            fn(*args, **kwargs)
            fn(*args, **kwargs)  # a memory hit
            c1 = store.counters.by_kind.get(kind, {})
            out[kind] = {f: c1.get(f, 0) - c0.get(f, 0) for f in ("compiles", "disk_hits")}
        fa4cache.uninstall()
        calls = quack_calls()
        # QuACK's own wrappers are back, holding what was compiled meanwhile.
        restored = all(calls[k][0] is originals[k] and len(originals[k].cache) == 1 for k in calls)
        store.counters.flush()
        print("RESULT " + json.dumps({"kinds": out, "restored": restored}), flush=True)
        return

    if a.action == "pool":
        # QuACK's async compile pool (its autotuner's and pytest plugin's protocol): a cold miss
        # raises CompilePending while a pool worker compiles; the caller retries.
        store = fa4cache.install()
        import quack  # noqa: F401
        from quack.cache import CompilePending, pool_scope

        fn, args, kwargs = quack_calls()["quack.rmsnorm_fwd"]
        pending = 0
        with pool_scope() as pool:
            while True:
                try:
                    fn(*args, **kwargs)
                    break
                except CompilePending:
                    pending += 1
                    time.sleep(0.1)
            submitted = pool.stats()["submitted"]
        v = store.counters.values
        print(
            "RESULT "
            + json.dumps(
                {
                    "pending": pending,
                    "submitted": submitted,
                    "compiles": v["compiles"],
                    "disk_hits": v["disk_hits"],
                }
            ),
            flush=True,
        )
        return

    import cutlass

    from tests.helpers import jit_kernels

    store_dir = os.environ["FA4CACHE_DIR"]
    _line_up(a.ready, a.go)
    fn = jit_kernels.compile_scale
    st = fn.__fa4cache_jit__
    t0 = time.perf_counter()
    k = fn(cutlass.Float32)
    seconds = time.perf_counter() - t0
    same = fn(cutlass.Float32, 16) is k and fn(dtype=cutlass.Float32, tag="") is k
    counters = st._store.counters
    counters.flush()
    print(
        "RESULT "
        + json.dumps(
            {
                "compiles": counters.values["compiles"],
                "disk_hits": counters.values["disk_hits"],
                "lock_waits": counters.values["lock_waits"],
                "same": same,
                "seconds": seconds,
                "store": str(st._store.root),
                "expected_store": store_dir,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
