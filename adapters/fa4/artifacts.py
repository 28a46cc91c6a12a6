"""FA4 kernels as store artifacts: export a compiled kernel to an object file, load one back.

A loader is only ever given the bytes that the store verified, as ``/proc/self/fd/N`` of
a sealed in-memory file (:func:`fa4cache.store.secure_io.loadable_path`), never a path in
the store or in a temp directory: nothing another user does to any directory between the
check and the load can change what runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fa4cache.store.secure_io import loadable_path
from fa4cache.store.store import Artifact

EXPORT_FUNCTION = "func"


def export(fn: Any, path: Path) -> bool:
    """Write compiled ``fn`` as an object file at ``path``; whether it is a TVM-FFI function."""
    fn.export_to_c(object_file_path=str(path), function_name=EXPORT_FUNCTION)
    return "TVMFFI" in type(fn).__name__ or "tvm_ffi" in type(fn).__module__


def load_callable(art: Artifact) -> Any:
    import cutlass.cute as cute

    # The DSL reads the whole file into memory (it dlopens only names ending in .so).
    with loadable_path(art.data, f"{art.ref.digest}.o") as path:
        module = cute.runtime.load_module(path, enable_tvm_ffi=art.sidecar.tvm_ffi)
        return getattr(module, EXPORT_FUNCTION)
