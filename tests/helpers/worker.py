"""A real process that uses fa4cache the way a training job does; tests run it as a subprocess.

Prints one JSON line (prefixed ``RESULT ``) with what this process did.
Usage: python -m tests.helpers.worker ACTION [options]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Cross-compile for an H200 on the CPU (must precede FA4's import).
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")


def _result(**kw: object) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["compile", "hashes", "lazy", "geometries", "attention"])
    p.add_argument("--mask", default="document")
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--geometries", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-file", help="start compiling only once this file exists (to line processes up)")
    p.add_argument("--marker", help="touch this file right before the first FA4 call")
    p.add_argument(
        "--compile-delay",
        type=float,
        default=0.0,
        help="sleep this long after each real cute.compile returns (a slow compile, still holding the lock)",
    )
    a = p.parse_args()

    if a.action == "lazy":
        import fa4cache

        store = fa4cache.install()
        heavy = sorted(m for m in ("torch", "cutlass", "ray", "flash_attn") if m in sys.modules)
        _result(heavy=heavy, root=str(store.root))
        return

    if a.action == "hashes":
        from fa4cache.masks import draft_block_mask, interval_mask

        _result(
            causal=interval_mask(causal=True).__cute_hash__,
            interval=interval_mask(causal=False).__cute_hash__,
            draft16=draft_block_mask(draft_block_size=16).__cute_hash__,
            draft8=draft_block_mask(draft_block_size=8).__cute_hash__,
            same_object=interval_mask(causal=True) is interval_mask(causal=True),
        )
        return

    import fa4cache
    from fa4cache.aot.spec import KernelSpec

    if os.environ.get("WORKER_SEES_GPU") == "1":
        # Compile as a process with a GPU does (its device files show none here): what runs
        # here under fake tensors is the same, what it compiles engine-less is not.
        from fa4cache.adapters.fa4 import export_only

        export_only.gpu_blind = lambda: False
    store = fa4cache.install()
    if a.wait_file:
        while not os.path.exists(a.wait_file):
            time.sleep(0.01)
    deferred_traces: list[bool] = []
    if os.environ.get("WORKER_WATCH_GC") == "1":
        # Whether full collections were deferred while the DSL traced each kernel
        # (adapters/fa4/gc_deferred.py).
        import gc

        from cutlass.base_dsl.dsl import BaseDSL

        real_trace = BaseDSL.generate_original_ir

        def watched_trace(*args: object, **kwargs: object) -> object:
            from fa4cache.adapters.fa4.gc_deferred import OUT_OF_REACH

            deferred_traces.append(gc.get_threshold()[2] == OUT_OF_REACH)
            return real_trace(*args, **kwargs)

        watched_trace.__fa4cache_codegen_neutral__ = True  # type: ignore[attr-defined]  (it looks, then traces)
        BaseDSL.generate_original_ir = watched_trace  # type: ignore[method-assign]
    t0 = time.perf_counter()
    if a.compile_delay:
        import cutlass.cute as cute

        real_compile = cute.compile

        def slow_compile(*args: object, **kwargs: object) -> object:
            fn = real_compile(*args, **kwargs)
            time.sleep(a.compile_delay)
            return fn

        slow_compile.__fa4cache_codegen_neutral__ = True  # type: ignore[attr-defined]  (same code, later)
        cute.compile = slow_compile
    if a.action == "compile":
        from fa4cache.adapters.compile.warm_specs import compile_spec

        if a.marker:
            open(a.marker, "w").close()
        compile_spec(KernelSpec(mask=a.mask, seqlen=a.seqlen, backward=not a.no_backward))
    elif a.action == "attention":  # random packings through fa4cache.attention's varlen path
        import torch
        from fa4cache.adapters.compile.warm_specs import fake_varlen_call
        from torch._subclasses.fake_tensor import FakeTensorMode

        from fa4cache.masks import make_document_mask

        g = torch.Generator().manual_seed(a.seed)
        kinds = ("causal", "bidirectional", "window", "prefix")
        for i in range(a.geometries):
            B = 1 + i % 3
            T = int(torch.randint(256, 4096, (1,), generator=g))
            ids = torch.cumsum(torch.rand(B, T, generator=g) < 0.004, 1)
            kind = kinds[i % len(kinds)]
            kw: dict = {"causal": kind != "bidirectional", "window": 128 if kind == "window" else None}
            if kind == "prefix":
                from tests.helpers.packing import run_lengths

                # At most each document's length (longer is an error).
                kw["prefix_lengths"] = torch.minimum(
                    torch.randint(0, 64, (B, 64), generator=g), run_lengths(ids, 64)
                )
            mask = make_document_mask(document_ids=ids, **kw)
            with FakeTensorMode():
                q = torch.empty(B, T, 4, 128, dtype=torch.bfloat16, device="cuda")
                kv = torch.empty(B, T, 2, 128, dtype=torch.bfloat16, device="cuda")
                fake_varlen_call(mask, q, kv, kv, backward=not a.no_backward)
    else:  # geometries: random document layouts, one FA4 forward+backward each
        import torch
        from fa4cache.adapters.compile.warm_specs import _fake_mask
        from flash_attn.cute import interface as fi
        from torch._subclasses.fake_tensor import FakeTensorMode

        from fa4cache.masks import make_document_mask

        g = torch.Generator().manual_seed(a.seed)
        for _ in range(a.geometries):
            T = int(torch.randint(256, 4096, (1,), generator=g))
            n = int(torch.randint(1, 9, (1,), generator=g))
            cuts = torch.sort(torch.randperm(T - 1, generator=g)[: n - 1] + 1).values
            cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])])
            mask = make_document_mask(cu)
            with FakeTensorMode():
                q = torch.empty(1, T, 4, 128, dtype=torch.bfloat16, device="cuda")
                mk = _fake_mask(mask)
                bwd = mk.pop("block_sparse_tensors_bwd")
                out, lse, *_ = fi._flash_attn_fwd(q, q, q, return_lse=True, **mk)
                if not a.no_backward:
                    mk["block_sparse_tensors"] = bwd
                    fi._flash_attn_bwd(q, q, q, out, torch.empty_like(out), lse, **mk)
    seconds = time.perf_counter() - t0
    store.counters.flush()
    c = store.counters.values
    from fa4cache.store import runtime

    tc = runtime.current_toolchain()
    patches = __import__("fa4cache.adapters.patch", fromlist=["x"])._installed.patches
    import gc

    _result(
        pid=os.getpid(),
        seconds=seconds,
        deferred_traces=deferred_traces,
        gc_threshold_after=list(gc.get_threshold()),
        toolchain=tc.id if tc else None,
        codegen_patches=sorted(tc.describe()["patches"]) if tc else [],
        compiles=int(c["compiles"]),
        misses=int(c["misses"]),
        disk_hits=int(c["disk_hits"]),
        corrupt=int(c["corrupt"]),
        publish_errors=int(c["publish_errors"]),
        lock_waits=int(c["lock_waits"]),
        memory_hits=sum(p.cache.memory_hits for p in patches),
        # kernels in memory compiled without the DSL's JIT engine (adapters/fa4/export_only.py)
        engineless=sum(
            1 for p in patches for fn in p.cache.cache.values() if getattr(fn, "engine", 0) is None
        ),
        engineless_kinds=sorted(
            p.cache.kind for p in patches for fn in p.cache.cache.values() if getattr(fn, "engine", 0) is None
        ),
        # engine-less kernels the cache stands in for with their published bytes
        stand_ins=sorted(
            p.cache.kind
            for p in patches
            for fn in p.cache.cache.values()
            if type(fn).__name__ == "_LoadsWhenCalled"
        ),
    )


if __name__ == "__main__":
    main()
