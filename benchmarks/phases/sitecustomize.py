"""Benchmark instrumentation (never installed): with this folder on ``PYTHONPATH`` and
``FA4CACHE_BENCH_PHASES`` naming a file, every process of a run (the step process, its compile
server and the server's forked children) appends one JSON line per phase of each kernel it
compiles: ``{"pid", "phase", "start", "end"}`` in wall-clock seconds.

Phases: ``server_spawn`` (a compile server started), ``server_import`` (in the server: from its
start to FA4 imported), ``lookup`` (fa4cache's key and store lookup for one FA4 compile-cache key), ``compile``
(``cute.compile`` as FA4 calls it, all of the below), ``trace`` (the DSL running the kernel's
Python into MLIR), ``codegen`` (the MLIR pass pipeline, ptxas included), ``publish`` (export and
store write); for a step's timeline also ``load`` (a store entry read and loaded), ``lock_wait``
(a key's lock taken, waiting for its holder), ``export``, ``plan`` (a kernel set listed),
``patch_check`` (the run-time patch walk), ``dsl_prepare``, ``arch_check`` and ``preprocess``
(the DSL's steps before a trace, and its AST rewrite of each function at its first call),
``gc_full`` (a full garbage collection: the whole process waits) and ``task`` (a compile server's child running its
task). The modules are wrapped as they are imported, so importing this costs nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import os
import sys
import time

_PATH = os.environ.get("FA4CACHE_BENCH_PHASES")


def _record(phase: str, start: float, end: float, **extra: object) -> None:
    line = json.dumps({"pid": os.getpid(), "phase": phase, "start": start, "end": end, **extra})
    fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _timed(fn, phase):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        t = time.time()
        try:
            return fn(*a, **k)
        finally:
            # the trace names the kernel (the DSL's function name, its 4th argument)
            name = a[4] if phase == "trace" and len(a) > 4 and isinstance(a[4], str) else None
            _record(phase, t, time.time(), **({"name": name} if name else {}))

    return wrapper


_WRAP = {
    "cutlass.base_dsl.dsl": [
        ("BaseDSL", "generate_original_ir", "trace"),
        # before the trace: the arguments canonicalised, the target arch checked
        ("BaseDSL", "_prepare_compilation", "dsl_prepare"),
        ("BaseDSL", "_is_supported_arch", "arch_check"),
        ("BaseDSL", "run_preprocessor", "preprocess"),  # a @cute.jit function's AST rewrite
    ],
    "cutlass.base_dsl.compiler": [("Compiler", "compile", "codegen")],
    "cutlass.cute": [(None, "compile", "compile")],
    # a compile server spawned (in the step process)
    "fa4cache.adapters.compile.server": [("CompileServer", "__init__", "server_spawn")],
    "fa4cache.adapters.fa4.compile_cache": [
        ("StoreCompileCache", "__contains__", "lookup"),
        ("StoreCompileCache", "__setitem__", "publish"),
        ("StoreCompileCache", "_try_load", "load"),
    ],
    # inside the phases above, for the timeline of a step (bench_cold_start's step part)
    "fa4cache.store.locks": [("StoreLocks", "acquire", "lock_wait")],
    "fa4cache.adapters.route": [("Route", "_export", "export")],
    "fa4cache.adapters.compile.kernel_set": [(None, "plan", "plan")],
    "fa4cache.adapters.compile.worker": [(None, "run_task", "task")],
    "fa4cache.patched_code": [(None, "runtime_patches", "patch_check")],
}


_IMPORTED = "flash_attn.cute.interface"  # a compile server's import of FA4, timed from its start
_T0 = time.time()


def _patch(mod) -> None:
    if mod.__name__ == _IMPORTED and os.environ.get("FA4CACHE_WORKER_PARENT"):
        _record("server_import", _T0, time.time())
    for owner, name, phase in _WRAP.get(mod.__name__, []):
        target = mod if owner is None else getattr(mod, owner, None)
        fn = getattr(target, name, None)
        if fn is None or getattr(fn, "__phase__", None):
            continue
        w = _timed(fn, phase)
        w.__phase__ = phase
        w.__fa4cache_codegen_neutral__ = True  # it times and calls the original: same code
        setattr(target, name, w)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _WRAP and fullname != _IMPORTED:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


_gc_start: list[float] = []


def _gc_phase(when: str, info: dict) -> None:
    """A full collection (generation 2) as a phase: its pause is the process's, whatever ran."""
    if info.get("generation") != 2:
        return
    import gc

    if when == "start":
        _gc_start[:] = [time.time(), gc.get_freeze_count(), gc.get_count()]
    elif _gc_start:
        start, frozen, counts = _gc_start
        _record(
            "gc_full", start, time.time(), collected=info.get("collected", 0), frozen=frozen,
            counts=list(counts), callbacks=[getattr(c, "__qualname__", repr(c)) for c in gc.callbacks],
        )  # fmt: skip


if _PATH:
    import gc

    sys.meta_path.insert(0, _Finder())
    gc.callbacks.append(_gc_phase)
