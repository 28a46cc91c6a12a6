"""``fa4cache warm``: cross-compile kernel sets into the store without a GPU (from flags,
a manifest, a transformers model's config.json, or the specs the store recorded).

The command builds a plan (:mod:`.warm_plan`), hands it to the one warm runner
(``fa4cache.warm``, which drives any workers) and prints its report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

from ..errors import ConfigError
from .common import plural, writable_store_settings
from .progress import HEARTBEAT_S, Progress  # noqa: F401  (HEARTBEAT_S: warm's progress setting)
from .warm_plan import Replay, _replay_specs, plan_from_args  # noqa: F401  (_replay_specs: tests)


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
    plan, rep = plan_from_args(args)
    if not getattr(args, "json", False):
        return _warm(args, plan, rep, cache_dir, {})
    # --json: the tables and lines go to stderr, one JSON summary to stdout.
    summary: dict[str, Any] = {"cache_dir": cache_dir, "specs": [], "jit": [], "generation": None}
    with contextlib.redirect_stdout(sys.stderr):
        code = _warm(args, plan, rep, cache_dir, summary)
    summary["failed"] = code != 0
    print(json.dumps(summary, indent=2))
    return code


def _warm(
    args: argparse.Namespace, plan: Any, rep: Replay | None, cache_dir: str, out: dict[str, Any]
) -> int:
    """Run ``plan``, print its table and summary lines; ``out`` collects what ``--json`` prints."""
    from fa4cache.adapters.compile import warm

    if not plan.items:
        print("nothing to warm")
        failed = 0
    else:
        target = plan.target
        print(f"target {target.label()}, {_stack()}, store {cache_dir}", flush=True)
        only_specs = len(plan.specs) == len(plan.items)
        t0 = time.perf_counter()
        what = "spec" if only_specs else "item"
        with Progress(cache_dir, len(plan.items), quiet=args.quiet, what=what) as progress:
            report = warm(plan, cache_dir, jobs=args.jobs, on_start=progress.start, on_row=progress.spec_done)
        print("\n".join(report.table()))
        out["target"] = {"arch": target.arch, "num_sms": target.sms()}
        failed = _summaries(report, out)
        out["seconds"] = round(time.perf_counter() - t0, 3)
        if plan.specs:
            spec_rows = _rows(report, "KernelSpec")
            compile_s = sum(r.compile_seconds for r in spec_rows)
            print(
                f"{plural(len(spec_rows), 'spec')}, {plural(sum(r.compiled for r in spec_rows), 'kernel')} "
                f"compiled ({compile_s:.1f} s compiling), {sum(not r.ok for r in spec_rows)} failed, "
                f"{time.perf_counter() - t0:.1f} s in all"
            )
    out["notes"] = rep.notes() if rep is not None else []
    for note in out["notes"]:
        print(note)
    return 1 if failed else 0


def _rows(report: Any, kind: str) -> list[Any]:
    return [r for r in report.rows if type(r.item).__name__ == kind]


def _summaries(report: Any, out: dict[str, Any]) -> int:
    """The jit and generation lines (and every kind's ``--json`` rows); how many items failed."""
    fields = ("compiled", "present", "compile_seconds", "seconds", "error")
    specs = _rows(report, "KernelSpec")
    out["specs"] = [
        {"spec": r.item.to_dict(), "label": r.label, **{_json_name(k): getattr(r, k) for k in fields}}
        for r in specs
    ]
    jit = _rows(report, "JitCall")
    if jit:
        out["jit"] = [
            {
                "call": r.label,
                "compiles": r.compiled,
                "present": r.present,
                "seconds": r.seconds,
                "error": r.error,
            }
            for r in jit
        ]
        print(
            f"{len(jit)} jit kernels, {sum(r.compiled for r in jit)} compiled, {sum(not r.ok for r in jit)} failed"
        )
    gen = _rows(report, "GenerationCall")
    if gen:
        errors = [f"{r.label}: {r.error}" for r in gen if r.error]
        kinds, seconds = sum(r.kernels or 0 for r in gen), sum(r.seconds for r in gen)
        compiled, present = sum(r.compiled for r in gen), sum(r.present for r in gen)
        out["generation"] = {
            "kernels": kinds,
            "compiles": compiled,
            "present": present,
            "errors": errors,
            "seconds": round(seconds, 3),
        }
        for e in errors:
            print(f"generation FAILED: {e[:160]}")
        print(
            f"generation: {kinds} kernel kinds, {compiled} compiled, {present} present, "
            f"{len(errors)} failed, {seconds:.1f} s"
        )
    return len(report.failed)


def table(results: list[tuple[Any, dict[str, Any]]]) -> tuple[list[str], int]:
    """The table of ``(item, result)`` pairs (:meth:`~fa4cache.WarmReport.table`) and how many failed."""
    from fa4cache.adapters.compile import WarmReport, WarmRow

    from ..aot.plan import Target

    keys = ("compiles", "present", "seconds", "error", "compile_seconds")
    rows = tuple(WarmRow(item, *(r[k] for k in keys)) for item, r in results)
    return WarmReport(Target(), rows).table(), sum(not r.ok for r in rows)


def _json_name(field: str) -> str:
    return "compiles" if field == "compiled" else field  # the summary's name since it began


def _stack() -> str:
    """Which GPU hosts the kernels are for, beyond the arch: the CUTLASS DSL's CUDA flavor."""
    from fa4cache.fingerprint import dsl_cuda

    cuda = dsl_cuda()
    if cuda == "cu13":
        return "DSL flavor cu13 (for hosts whose driver supports CUDA 13; cu12 hosts: install nvidia-cutlass-dsl without [cu13])"
    if cuda == "cu12":
        return "DSL flavor cu12 (for hosts that pick cu12; CUDA 13 hosts: install nvidia-cutlass-dsl[cu13])"
    return f"DSL flavor {cuda}"
