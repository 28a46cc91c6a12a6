"""Kernels compiled for the store without the DSL's host JIT engine.

The DSL builds a host launcher for each kernel it compiles, an LLVM JIT engine and, for a
TVM-FFI function, an object file and a JITLink engine: 0.28-0.38 s of a compile, whether or not
the kernel ever runs in that process. ``cute.compile(..., no_jit_engine=True)``, the DSL's own
option, skips both; the object file fa4cache exports is the same, byte for byte
(``tests/adapters/fa4/test_export_only.py``). Two kinds of compile take it:

* where no GPU is visible (a compile server's children, ``fa4cache warm`` on a CPU machine),
  every FA4 or QuACK kernel compiled for the store: nothing can run here, the kernel is
  exported and that is all;
* in a process with a GPU, a forward kernel compiled for a store that can take it
  (:data:`ENGINELESS_KINDS`; a writable store, where
  :attr:`~fa4cache.fa4_releases.Coupling.ENGINELESS_FORWARD` was verified): FA4's forward
  calls its kernel through its compile cache, where fa4cache stands in for it with the bytes it
  has just published, loaded at the first call (a warm process's load, milliseconds). A cold
  step's own forward is on its critical path; its backward kernels are compiled by a server's
  GPU-blind children meanwhile.

:func:`enable` wraps the DSL's ``CompileCallable._compile`` so that the option is added only
where this thread compiles a kernel for the store (a miss is pending,
:func:`fa4cache.adapters.fa4.compile_cache.store_miss_pending`), the function compiled is
FA4's or QuACK's (a host-only ``@cute.jit`` function of the user's keeps the engine it runs on),
and one of the two cases above holds at the compile. Every other compile is the DSL's own.
The cache never holds the engine-less kernel itself, even while it is being published (another
thread may find the key then). Should it be called where its bytes do not load (a publish
that failed), the compile cache runs the DSL's own compile of it again, with a warning
(:class:`~fa4cache.adapters.fa4.compile_cache.StoreCompileCache`). On only for the DSL releases
it was checked on (:data:`VERIFIED_DSL`); ``FA4CACHE_EXPORT_ONLY=0`` turns it off.

The same wrapper runs every compile for the store, engine-less or not, with full garbage
collections deferred until it ends (:mod:`fa4cache.adapters.fa4.gc_deferred`, ``FA4CACHE_GC_DEFER``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from typing import Any

from fa4cache.settings import setting

log = logging.getLogger(__name__)

# nvidia-cutlass-dsl releases whose compile takes ``no_jit_engine`` and exports the same bytes
# without the engine (the test above, against the installed FA4 releases).
VERIFIED_DSL = frozenset({"4.8.1"})
_MARK = "__fa4cache_export_only__"
# The code whose kernels fa4cache stores: a function compiled from anywhere else is the DSL's own.
LIBRARIES = ("flash_attn.cute", "quack")
# The store kinds whose FA4 entry point calls the kernel it compiled through its compile cache
# on every release listing Coupling.ENGINELESS_FORWARD (4.0.0b40's backward calls its local
# ``compiled_bwd``: an engine-less one would fail there).
ENGINELESS_KINDS = frozenset({"fwd"})
_lock = threading.Lock()


def library_kernel(func: Any) -> bool:
    """Whether ``func`` (a function, bound method or callable instance) is FA4's or QuACK's."""
    module = getattr(func, "__module__", None)
    return isinstance(module, str) and any(module == p or module.startswith(p + ".") for p in LIBRARIES)


def gpu_blind() -> bool:
    """Whether no kernel can run in this process now: no GPU in the device files or
    ``CUDA_VISIBLE_DEVICES``, and torch has not started CUDA (asked again at each compile: a
    process may be given a GPU after fa4cache is installed)."""
    from fa4cache.arch import cuda_devices_visible

    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return False
        except Exception:  # a torch without CUDA support, or half imported: ask the device files
            pass
    return not cuda_devices_visible()


def _dsl_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        return None


def enable() -> bool:
    """Wrap the DSL's compile (idempotent); False where the DSL is not a verified release, or
    nothing applies here: no deferral of full collections (``FA4CACHE_GC_DEFER=0``), and no export-only compile
    (the setting off, or a GPU visible here, where a kernel may run, and an installed FA4 whose
    forward is not verified to run from its published bytes)."""
    export, defer = setting("FA4CACHE_EXPORT_ONLY"), setting("FA4CACHE_GC_DEFER")
    if not (export or defer):
        return False
    version = _dsl_version()
    if version not in VERIFIED_DSL:
        log.debug("fa4cache: store compiles wrapped: off: nvidia-cutlass-dsl %s is not verified", version)
        return False
    from fa4cache import fa4_releases

    # (GPU or not is asked of the device files and CUDA_VISIBLE_DEVICES, not of CUDA: starting
    # its driver here would break fork.)
    forward_here = export and fa4_releases.on(fa4_releases.Coupling.ENGINELESS_FORWARD)
    # (A GPU visible now and a forward not verified: never export-only in this process, as
    # without the deferral, whatever the device files say later.)
    exporting = export and (forward_here or gpu_blind())
    if not (exporting or defer):
        return False
    from cutlass.base_dsl.compiler import CompileCallable
    from fa4cache.adapters.fa4 import gc_deferred
    from fa4cache.adapters.fa4.compile_cache import RECOMPILE, pending_kind, store_miss_pending

    def engineless() -> bool:
        return exporting and (gpu_blind() or (forward_here and pending_kind() in ENGINELESS_KINDS))

    def store_compile(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        with gc_deferred.deferred() if defer else contextlib.nullcontext():
            return original(self, func, *args, **kwargs)

    with _lock:
        original = CompileCallable._compile
        if getattr(original, _MARK, False):
            return True

        @functools.wraps(original)
        def _compile(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            if "no_jit_engine" in kwargs or not (store_miss_pending() and library_kernel(func)):
                return original(self, func, *args, **kwargs)  # not a kernel for the store
            if not engineless():
                return store_compile(self, func, *args, **kwargs)
            fn = store_compile(self, func, *args, no_jit_engine=True, **kwargs)
            try:  # the way back to the DSL's own compile, should the stored bytes not load
                setattr(fn, RECOMPILE, lambda: store_compile(self, func, *args, **kwargs))
            except (AttributeError, TypeError):
                pass
            return fn

        setattr(_compile, _MARK, True)
        CompileCallable._compile = _compile
    return True


def disable() -> None:
    """Put the DSL's own compile back (tests)."""
    try:
        from cutlass.base_dsl.compiler import CompileCallable
    except ImportError:
        return
    with _lock:
        current = CompileCallable._compile
        if getattr(current, _MARK, False):
            CompileCallable._compile = current.__wrapped__
