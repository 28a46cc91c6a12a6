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
while this thread compiles a kernel for the store (a miss is pending,
:func:`fa4cache.adapters.fa4.compile_cache.store_miss_pending`) in a process that sees no
GPU; every other compile is the DSL's own. On only for the DSL releases it was checked on
(:data:`VERIFIED_DSL`); ``FA4CACHE_EXPORT_ONLY=0`` turns it off.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from fa4cache.settings import setting

log = logging.getLogger(__name__)

# nvidia-cutlass-dsl releases whose compile takes ``no_jit_engine`` and exports the same bytes
# without the engine (the test above, against the installed FA4 releases).
VERIFIED_DSL = frozenset({"4.8.1"})
_MARK = "__fa4cache_export_only__"
_lock = threading.Lock()


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
    from fa4cache.arch import cuda_devices_visible

    if cuda_devices_visible():
        # A kernel compiled here may run here. (Asked of the device files and
        # CUDA_VISIBLE_DEVICES, not of CUDA: starting its driver here would break fork.)
        return False
    from cutlass.base_dsl.compiler import CompileCallable
    from fa4cache.adapters.fa4.compile_cache import store_miss_pending

    with _lock:
        original = CompileCallable._compile
        if getattr(original, _MARK, False):
            return True

        @functools.wraps(original)
        def _compile(self: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            if store_miss_pending():
                kwargs.setdefault("no_jit_engine", True)
            return original(self, func, *args, **kwargs)

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
