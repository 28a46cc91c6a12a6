"""``fa4cache warm``: cross-compile kernel sets into the store without a GPU (from flags,
a manifest, a transformers model's config.json, or the specs the store recorded)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..errors import ConfigError
from .common import open_store, plural, settings_of


def _specs_from_flags(args: argparse.Namespace) -> list[Any]:
    from fa4cache.aot.spec import KernelSpec

    heads, _, hkv = (args.heads or "16").partition(":")
    try:
        h = int(heads)
        h_kv = int(hkv) if hkv else None
    except ValueError:
        raise ConfigError(f"--heads: expected N or N:M, got {args.heads!r}") from None
    masks = args.mask or ["document"]
    out = []
    for dtype in args.dtype or ["bf16"]:
        for hd in args.head_dim or [128]:
            for m in masks:
                mask = m
                if m == "document" and args.window:
                    mask = "document_window"
                if m == "document" and args.causal is False:
                    mask = "document_bidirectional"
                out.append(
                    KernelSpec(
                        dtype=dtype,
                        head_dim=hd,
                        heads=h,
                        heads_kv=h_kv,
                        mask=mask,
                        backward=args.backward,
                        seqlen=args.seqlen,
                        window=args.window or 256,
                        arch=args.arch,
                        varlen=args.varlen,
                    )
                )
    return out


def _replay_specs(args: argparse.Namespace) -> tuple[list[Any], int]:
    from fa4cache.aot.spec import KernelSpec

    # Every recorded spec, whatever its toolchain: what is already compiled for the
    # toolchain doing the warming shows as "present".
    store = open_store(args)
    seen: dict[str, Any] = {}
    unreplayable = 0
    for e in store.layout.iter_entries():
        side = store.read_sidecar(e.ref)
        spec = side.spec if side else None
        if not isinstance(spec, dict):
            unreplayable += 1
            continue
        try:
            ks = KernelSpec.from_dict(spec)
        except ConfigError:
            unreplayable += 1
            continue
        seen[json.dumps(ks.to_dict(), sort_keys=True)] = ks
    return list(seen.values()), unreplayable


def _warm_worker(spec_dict: dict[str, Any], cache_dir: str | None) -> dict[str, Any]:
    import warnings

    # FA4 and the DSL warn about their own deprecations on every import; not the user's concern here.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*cannot be converted to a JitArgument.*")
    from fa4cache.aot.spec import KernelSpec

    from ..adapters.warm import warm

    r = warm([KernelSpec.from_dict(spec_dict)], cache_dir)[0]
    return {
        "compiles": r.compiles,
        "present": r.present,
        "seconds": r.seconds,
        "compile_seconds": r.compile_seconds,
        "error": r.error,
    }


def table(results: list[tuple[Any, dict[str, Any]]]) -> tuple[list[str], int]:
    """The result table's lines (columns as wide as the longest spec) and how many failed.

    "compile s" is what ``fa4cache stats`` counts (each kernel from its miss to its
    publication); "wall s" adds the mask, FA4's tracing and loads."""
    w = max(len("spec"), *(len(s.label()) for s, _ in results))
    lines = [f"{'spec':<{w}}  {'compiled':>8}  {'present':>7}  {'compile s':>9}  {'wall s':>7}  status"]
    failed = 0
    for s, r in results:
        status = "ok" if r["error"] is None else f"FAILED: {r['error'][:80]}"
        failed += r["error"] is not None
        lines.append(
            f"{s.label():<{w}}  {r['compiles']:>8}  {r['present']:>7}  {r['compile_seconds']:>9.1f}  "
            f"{r['seconds']:>7.1f}  {status}"
        )
    return lines, failed


def cmd_warm(args: argparse.Namespace) -> int:
    from fa4cache.aot.spec import load_manifest
    from fa4cache.extras import require

    require("compiling kernels", "torch", "flash_attn", "cutlass")
    # warm compiles for --arch and runs no kernel: with the GPU hidden from this process
    # (before torch is imported), its -j workers fork from it once FA4 is imported, and the
    # import (seconds; 10 s and more on a busy GPU host) is paid once instead of once per worker.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

    unreplayable = 0
    if args.replay:
        specs, unreplayable = _replay_specs(args)
    elif args.manifest:
        specs = load_manifest(args.manifest)
    elif args.hf_config:
        from fa4cache.aot.model_config import load_config, specs_for

        specs = specs_for(
            load_config(args.hf_config), dtypes=args.dtype, backward=args.backward, arch=args.arch
        )
    else:
        specs = _specs_from_flags(args)
    from .warm_jit import calls_from_args, run  # QuACK / jit_cache kernels (fa4cache.aot.jit_spec)

    jit_calls = calls_from_args(args)
    jit_failed = run(jit_calls, str(settings_of(args).cache_dir)) if jit_calls else 0
    if jit_calls and not specs:
        return 1 if jit_failed else 0
    if not specs:
        print(
            "nothing to warm"
            + (f" ({unreplayable} old entries carry no replayable spec)" if unreplayable else "")
        )
        return 0
    cache_dir = str(settings_of(args).cache_dir)
    archs = sorted({s.arch.rstrip("a") for s in specs})
    if len(archs) > 1:
        # FA4 reads its target arch once, at import: one process compiles for one arch.
        raise ConfigError(f"one target arch per run, got {', '.join(archs)}; run warm once per arch")
    from ..adapters.warm import set_cross_compile_env

    set_cross_compile_env(specs[0].arch)
    from ..arch import describe

    target = describe()
    print(f"target {target['arch']} ({target['num_sms']} SMs), store {cache_dir}", flush=True)
    results: list[tuple[Any, dict[str, Any]]] = []
    t0 = time.perf_counter()
    progress = sys.stderr.isatty() and not args.quiet

    def report(i: int, spec: Any, r: dict[str, Any]) -> None:
        if progress:
            done = int(30 * i / len(specs))
            sys.stderr.write(f"\r[{'#' * done}{'.' * (30 - done)}] {i}/{len(specs)} {spec.label()[:40]:<40}")
            sys.stderr.flush()

    from ..adapters.warm_parallel import default_jobs, warm_parallel

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"-j/--jobs: expected a positive number of workers, got {args.jobs}")
    jobs = args.jobs if args.jobs is not None else default_jobs(specs)
    if jobs > 1:
        # Every kernel of every spec is one unit of work: -j spreads the kernels of one spec too.
        for i, (s, r) in enumerate(zip(specs, warm_parallel(specs, jobs, cache_dir)), 1):
            results.append((s, r))
            report(i, s, r)
    else:
        for i, s in enumerate(specs, 1):
            r = _warm_worker(s.to_dict(), cache_dir)
            results.append((s, r))
            report(i, s, r)
    if progress:
        sys.stderr.write("\n")
    lines, failed = table(results)
    print("\n".join(lines))
    total = sum(r["compiles"] for _, r in results)
    compile_s = sum(r["compile_seconds"] for _, r in results)
    print(
        f"{plural(len(results), 'spec')}, {plural(total, 'kernel')} compiled ({compile_s:.1f} s compiling), "
        f"{failed} failed, {time.perf_counter() - t0:.1f} s in all"
    )
    if unreplayable:
        print(f"{unreplayable} entries carry no spec (compiled by training calls) and were not replayed")
    if getattr(args, "generation", False) and args.hf_config:
        failed += _warm_generation(args, sorted({s.dtype for s in specs}), cache_dir)
    return 1 if failed or jit_failed else 0


def _warm_generation(args: argparse.Namespace, dtypes: list[str], cache_dir: str) -> int:
    from fa4cache.aot.model_config import load_config

    from ..adapters.warm_generation import warm_generation

    g = warm_generation(load_config(args.hf_config), dtypes=dtypes, cache_dir=cache_dir)
    for e in g.errors:
        print(f"generation FAILED: {e[:160]}")
    print(
        f"generation: {g.kernels} kernel kinds, {g.compiles} compiled, {g.present} present, "
        f"{len(g.errors)} failed, {g.seconds:.1f} s"
    )
    return len(g.errors)
