"""Kernels that are only exported: compiled without the DSL's host JIT engine.

Where no GPU is visible (a compile server's children, ``fa4cache warm`` on a CPU machine), no
kernel can ever run: a kernel FA4 compiles through the store's miss path is exported to the
store and that is all. The DSL still builds its host launcher twice over for it, an LLVM JIT
engine and, for a TVM-FFI function, an object file and a JITLink engine: 0.28-0.34 s of a
1.3-1.7 s compile on the CPU machine, on the critical path of a cold step whose backward a
server child compiles. ``cute.compile(..., no_jit_engine=True)``, the DSL's own option for
this, skips both; the object file fa4cache exports is the same, byte for byte
(``tests/adapters/fa4/test_export_only.py``).

:func:`enable` wraps the DSL's ``CompileCallable._compile`` so that the option is added only
where all of these hold at the compile: this thread compiles a kernel for the store (a miss
is pending, :func:`fa4cache.adapters.fa4.compile_cache.store_miss_pending`), the function
compiled is FA4's or QuACK's (a host-only ``@cute.jit`` function of the user's keeps the
engine it runs on), and the process still sees no GPU (device files, ``CUDA_VISIBLE_DEVICES``,
torch's CUDA not started). Every other compile is the DSL's own. Should an engine-less kernel
be called all the same (a GPU the device files did not show), the compile cache stands in for
it with the published bytes, loaded at the first call, or where they do not load, with the
DSL's own compile of it, done again
(:class:`~fa4cache.adapters.fa4.compile_cache.StoreCompileCache`). On only for the DSL
releases it was checked on (:data:`VERIFIED_DSL`); ``FA4CACHE_EXPORT_ONLY=0`` turns it off.
"""

from __future__ import annotations

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
    """Wrap the DSL's compile (idempotent); False where the DSL is not a verified release, a
    GPU is visible here (a kernel may run), or the setting is off."""
    if not setting("FA4CACHE_EXPORT_ONLY"):
        return False
    version = _dsl_version()
    if version not in VERIFIED_DSL:
        log.debug("fa4cache: export-only compiles off: nvidia-cutlass-dsl %s is not verified", version)
        return False
    if not gpu_blind():
        # A kernel compiled here may run here. (Asked of the device files and
        # CUDA_VISIBLE_DEVICES, not of CUDA: starting its driver here would break fork.)
        return False
    from cutlass.base_dsl.compiler import CompileCallable
    from fa4cache.adapters.fa4.compile_cache import RECOMPILE, store_miss_pending

    with _lock:
        original = CompileCallable._compile
        if getattr(original, _MARK, False):
            return True

        @functools.wraps(original)
        def _compile(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            if "no_jit_engine" in kwargs or not (
                store_miss_pending() and library_kernel(func) and gpu_blind()
            ):
                return original(self, func, *args, **kwargs)
            fn = original(self, func, *args, no_jit_engine=True, **kwargs)
            try:  # the way back to the DSL's own compile, should the stored bytes not load
                setattr(fn, RECOMPILE, lambda: original(self, func, *args, **kwargs))
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
