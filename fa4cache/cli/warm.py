"""``fa4cache warm``: cross-compile kernel sets into the store without a GPU (from flags,
a manifest, a transformers model's config.json, or the specs the store recorded)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import NoStoreYet, open_store, plural, writable_store_settings

DEFAULT_ARCH = "sm_90"  # --arch when none is given (H100/H200)
HEARTBEAT_S = 15.0  # without a terminal: a line at least this often while compiling


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
                        arch=args.arch or DEFAULT_ARCH,
                        varlen=args.varlen,
                    )
                )
    return out


@dataclass
class Replay:
    """What ``warm --replay`` found in the store's sidecars."""

    specs: list[Any] = field(default_factory=list)  # FA4 kernel specs for the arch asked for
    jit_calls: list[Any] = field(default_factory=list)  # QuACK / jit_cache calls, same arch
    generation: list[dict[str, Any]] = field(default_factory=list)  # warm --generation's calls
    other_archs: dict[str, int] = field(default_factory=dict)  # specs left out, by arch
    unreplayable: int = 0  # entries without a recorded spec (training calls, older warms)


def _norm_arch(arch: str) -> str:
    return arch.rstrip("a")


def _replay_specs(args: argparse.Namespace) -> Replay:
    from fa4cache.aot.jit_spec import JitCall

    # Every recorded spec, whatever its toolchain: what is already compiled for the
    # toolchain doing the warming shows as "present".
    rep = Replay()
    try:
        store = open_store(args)
    except NoStoreYet:
        return rep
    seen: dict[str, Any] = {}
    for e in store.entries():
        side = store.read_sidecar(e.ref)
        spec = side.spec if side else None
        try:
            item = _replayable(spec)
        except (ConfigError, ValueError):  # no spec (None), or one this version cannot read
            rep.unreplayable += 1
            continue
        as_dict = item if isinstance(item, dict) else item.to_dict()
        seen[json.dumps([type(item).__name__, as_dict], sort_keys=True)] = item
    archs = sorted({_norm_arch(_arch_of(i)) for i in seen.values()})
    want = _norm_arch(args.arch) if args.arch else None
    if want is None and len(archs) > 1:
        raise ConfigError(
            f"the store holds specs for {', '.join(archs)}: one target arch per run (FA4 reads it at "
            f"import); run {' then '.join(f'`fa4cache warm --replay --arch {a}`' for a in archs)}"
        )
    for item in seen.values():
        arch = _norm_arch(_arch_of(item))
        if want is not None and arch != want:
            rep.other_archs[arch] = rep.other_archs.get(arch, 0) + 1
        elif isinstance(item, dict):
            rep.generation.append(item)
        elif isinstance(item, JitCall):
            rep.jit_calls.append(item)
        else:
            rep.specs.append(item)
    return rep


def _replayable(spec: Any) -> Any:
    """What a sidecar's spec replays as: a KernelSpec, a JitCall (QuACK, jit_cache) or a
    generation call (a dict). Raises ConfigError or ValueError for none of these."""
    from fa4cache.adapters.compile import GENERATION_KEY, check_item
    from fa4cache.aot.jit_spec import JIT_KEY, JitCall
    from fa4cache.aot.spec import KernelSpec

    if isinstance(spec, dict) and JIT_KEY in spec:
        return JitCall.from_dict(spec)
    if isinstance(spec, dict) and GENERATION_KEY in spec:
        return check_item(spec)
    return KernelSpec.from_dict(spec)


def _arch_of(item: Any) -> str:
    return str(item["arch"]) if isinstance(item, dict) else str(item.arch)


def _warm_worker(spec_dict: dict[str, Any], cache_dir: str | None) -> dict[str, Any]:
    import warnings

    from fa4cache.adapters.compile import warm
    from fa4cache.aot.spec import KernelSpec

    with warnings.catch_warnings():
        # FA4 and the DSL warn about their own deprecations on every import; not the user's concern here.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
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


def _usable_store(args: argparse.Namespace) -> str:
    """The store directory warm writes to, refused up front (exit 2, naming the setting and
    the fix) where nothing could be saved: a file in the way, a directory that is not
    writable, one the store opens read-only. A warm that reports kernels compiled must have
    stored them."""
    from fa4cache.store.store import Store

    from ..cache_dir import cache_dir_error

    s = writable_store_settings(args)
    store = Store(s)  # the store warm's workers open: a subdirectory in the way makes it read-only
    if not store.writable:
        raise cache_dir_error(s, "cannot be written (the warning above says why): kernels would not be saved")
    return str(store.root)


def _specs(args: argparse.Namespace) -> tuple[list[Any], list[Any], Replay | None]:
    """The FA4 specs and jit calls to warm, and what --replay found."""
    from fa4cache.aot.spec import load_manifest

    from .warm_jit import calls_from_args  # QuACK / jit_cache kernels (fa4cache.aot.jit_spec)

    if args.replay:
        rep = _replay_specs(args)
        return rep.specs, rep.jit_calls, rep
    if args.manifest:
        specs = load_manifest(args.manifest)
    elif args.hf_config:
        from fa4cache.aot.model_config import load_config, specs_for

        specs = specs_for(
            load_config(args.hf_config),
            dtypes=args.dtype,
            backward=args.backward,
            arch=args.arch or DEFAULT_ARCH,
        )
    else:
        specs = _specs_from_flags(args)
    return specs, calls_from_args(args), None


def _replay_notes(rep: Replay | None) -> list[str]:
    """What --replay left out, each with the command that includes it."""
    if rep is None:
        return []
    notes = [
        f"left out {plural(n, 'spec')} for {arch}: run `fa4cache warm --replay --arch {arch}` for them"
        for arch, n in sorted(rep.other_archs.items())
    ]
    if rep.unreplayable:
        notes.append(
            f"{rep.unreplayable} {'entry carries' if rep.unreplayable == 1 else 'entries carry'} no "
            "replayable spec (compiled by training calls or by `warm --generation`, or by an older "
            "fa4cache): run the jobs or the warm that made them again"
        )
    return notes


def cmd_warm(args: argparse.Namespace) -> int:
    from fa4cache.extras import require

    require("compiling kernels", "torch", "flash_attn", "cutlass")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"-j/--jobs: expected a positive number of workers, got {args.jobs}")
    cache_dir = _usable_store(args)
    from fa4cache.store import counters

    # Its lookups (and its workers', forked from here) are warm's own, not a job's hits.
    counters.mark_warm_process()
    # warm compiles for --arch and runs no kernel: with the GPU hidden from this process
    # (before torch is imported), its -j workers fork from it once FA4 is imported, and the
    # import (seconds; 10 s and more on a busy GPU host) is paid once instead of once per worker.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    specs, jit_calls, rep = _specs(args)
    if not getattr(args, "json", False):
        return _warm(args, specs, jit_calls, rep, cache_dir, {})
    # --json: the tables and lines go to stderr, one JSON summary to stdout.
    import contextlib

    summary: dict[str, Any] = {"cache_dir": cache_dir, "specs": [], "jit": [], "generation": None}
    with contextlib.redirect_stdout(sys.stderr):
        code = _warm(args, specs, jit_calls, rep, cache_dir, summary)
    summary["failed"] = code != 0
    print(json.dumps(summary, indent=2))
    return code


def _warm(
    args: argparse.Namespace,
    specs: list[Any],
    jit_calls: list[Any],
    rep: Any,
    cache_dir: str,
    out: dict[str, Any],
) -> int:
    """warm's work; ``out`` collects the summary ``--json`` prints."""
    from .warm_jit import run

    jit_failed = run(jit_calls, cache_dir, out) if jit_calls else 0
    generation = rep.generation if rep is not None else []
    if not (specs or jit_calls or generation):
        print("nothing to warm")
    failed = _warm_specs(args, specs, cache_dir, out) if specs else 0
    if generation:  # --replay of warm --generation's calls
        if not specs:
            from fa4cache.adapters.compile import set_cross_compile_env

            set_cross_compile_env(generation[0]["arch"])
        failed += _report_generation(generation, cache_dir, out, quiet=args.quiet)
    elif getattr(args, "generation", False) and args.hf_config and specs:
        failed += _warm_generation(args, sorted({s.dtype for s in specs}), cache_dir, out)
    out["notes"] = _replay_notes(rep)
    for note in out["notes"]:
        print(note)
    return 1 if failed or jit_failed else 0


def _warm_specs(args: argparse.Namespace, specs: list[Any], cache_dir: str, out: dict[str, Any]) -> int:
    """Compile the FA4 ``specs`` (one target arch), print the table; how many failed."""
    archs = sorted({_norm_arch(s.arch) for s in specs})
    if len(archs) > 1:
        # FA4 reads its target arch once, at import: one process compiles for one arch.
        raise ConfigError(f"one target arch per run, got {', '.join(archs)}; run warm once per arch (--arch)")
    from fa4cache.adapters.compile import set_cross_compile_env

    set_cross_compile_env(specs[0].arch)
    from ..arch import describe

    target = describe()
    print(
        f"target {target['arch']} ({target['num_sms']} SMs), {_stack()}, store {cache_dir}",
        flush=True,
    )
    t0 = time.perf_counter()
    with Progress(cache_dir, len(specs), quiet=args.quiet) as progress:
        results = _run_specs(args, specs, cache_dir, progress)
    lines, failed = table(results)
    print("\n".join(lines))
    total = sum(r["compiles"] for _, r in results)
    compile_s = sum(r["compile_seconds"] for _, r in results)
    out["target"] = {"arch": target["arch"], "num_sms": target["num_sms"]}
    out["specs"] = [
        {
            "spec": s.to_dict(),
            "label": s.label(),
            **{k: r[k] for k in ("compiles", "present", "compile_seconds", "seconds", "error")},
        }
        for s, r in results
    ]
    out["seconds"] = round(time.perf_counter() - t0, 3)
    print(
        f"{plural(len(results), 'spec')}, {plural(total, 'kernel')} compiled ({compile_s:.1f} s compiling), "
        f"{failed} failed, {time.perf_counter() - t0:.1f} s in all"
    )
    return failed


def _run_specs(
    args: argparse.Namespace, specs: list[Any], cache_dir: str, progress: Progress
) -> list[tuple[Any, dict[str, Any]]]:
    from fa4cache.adapters.compile import default_jobs, warm_parallel

    jobs = args.jobs if args.jobs is not None else default_jobs(specs)
    results: list[tuple[Any, dict[str, Any]]] = []
    if jobs > 1:
        # Every kernel of every spec is one unit of work: -j spreads the kernels of one spec too.
        for s, r in zip(specs, warm_parallel(specs, jobs, cache_dir, on_fork=progress.start)):
            results.append((s, r))
            progress.spec_done(s)
        return results
    progress.start()
    for s in specs:
        results.append((s, _warm_worker(s.to_dict(), cache_dir)))
        progress.spec_done(s)
    return results


class Progress:
    """What warm is doing while it works, on stderr (stdout keeps the table): on a terminal
    one line redrawn, else one line per kernel stored, so that a one-spec warm of a minute
    does not look hung. Kernels are seen as they land in the store (a thread lists its
    entries each second), which works the same for -j workers and for -j 1."""

    def __init__(self, cache_dir: str, n_specs: int, *, quiet: bool, what: str = "spec") -> None:
        from fa4cache.store.paths import Layout

        self.what = what
        self.layout = Layout(Path(cache_dir))
        self.n_specs = n_specs
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.specs_done = 0
        self.kernels: set[Any] = set()
        self._before: set[Any] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> Progress:
        if not self.quiet:
            self._before = self._entries()
            sys.stderr.write(
                f"warming {plural(self.n_specs, self.what)}: one line per kernel stored\n"
                if not self.tty
                else ""
            )
        return self

    def _entries(self) -> set[Any]:
        return {(e.ref.kind, e.ref.digest) for e in self.layout.iter_entries()}

    def start(self) -> None:
        """Start watching; called once the -j workers are forked (a fork copies threads badly)."""
        if self.quiet or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="fa4cache-warm-progress", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        quiet_since = time.perf_counter()
        while not self._stop.wait(1.0):
            n = len(self.kernels)
            self._poll()
            if len(self.kernels) != n:
                quiet_since = time.perf_counter()
            elif not self.tty and time.perf_counter() - quiet_since >= HEARTBEAT_S:
                # A long kernel (a minute on a busy CPU) must not look like a hang in a log.
                sys.stderr.write(f"  still compiling ({self._elapsed()})\n")
                sys.stderr.flush()
                quiet_since = time.perf_counter()

    def _poll(self) -> None:
        try:
            new = self._entries() - self._before - self.kernels
        except OSError:
            return
        for kind, _ in sorted(new):
            self.kernels.add((kind, _))
            if not self.tty:
                sys.stderr.write(f"  stored {kind} kernel ({len(self.kernels)} so far, {self._elapsed()})\n")
        self._draw()

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self._t0:.0f} s"

    def _draw(self) -> None:
        if self.tty and not self.quiet:
            done = int(30 * self.specs_done / self.n_specs)
            sys.stderr.write(
                f"\r[{'#' * done}{'.' * (30 - done)}] {self.specs_done}/{self.n_specs} {self.what}s, "
                f"{plural(len(self.kernels), 'kernel')} compiled, {self._elapsed()}  "
            )
        sys.stderr.flush()

    def spec_done(self, spec: Any) -> None:
        self.specs_done += 1
        self._draw()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.quiet:
            self._poll()
            if self.tty:
                sys.stderr.write("\n")


def _warm_generation(args: argparse.Namespace, dtypes: list[str], cache_dir: str, out: dict[str, Any]) -> int:
    from fa4cache.adapters.compile import generation_items
    from fa4cache.aot.model_config import load_config

    return _report_generation(
        generation_items(load_config(args.hf_config), dtypes, args.arch or DEFAULT_ARCH),
        cache_dir,
        out,
        quiet=args.quiet,
    )


def _report_generation(
    items: list[dict[str, Any]], cache_dir: str, out: dict[str, Any], *, quiet: bool = False
) -> int:
    from fa4cache.adapters.compile import warm_generation_items

    # One line per kernel stored, as for the specs (the calls run in this process).
    with Progress(cache_dir, len(items), quiet=quiet, what="generation call") as progress:
        progress.start()
        g = warm_generation_items(items, cache_dir=cache_dir)
        progress.specs_done = len(items)
    out["generation"] = {
        "kernels": g.kernels,
        "compiles": g.compiles,
        "present": g.present,
        "errors": list(g.errors),
        "seconds": round(g.seconds, 3),
    }
    for e in g.errors:
        print(f"generation FAILED: {e[:160]}")
    print(
        f"generation: {g.kernels} kernel kinds, {g.compiles} compiled, {g.present} present, "
        f"{len(g.errors)} failed, {g.seconds:.1f} s"
    )
    return len(g.errors)


def _stack() -> str:
    """Which GPU hosts the kernels are for, beyond the arch: the CUTLASS DSL's CUDA flavor."""
    from fa4cache.fingerprint import dsl_cuda

    cuda = dsl_cuda()
    if cuda == "cu13":
        return "DSL flavor cu13 (for hosts whose driver supports CUDA 13; cu12 hosts: install nvidia-cutlass-dsl without [cu13])"
    if cuda == "cu12":
        return "DSL flavor cu12 (for hosts that pick cu12; CUDA 13 hosts: install nvidia-cutlass-dsl[cu13])"
    return f"DSL flavor {cuda}"
