"""FA4 kernels as store artifacts: export a compiled kernel to an object file, load one back.

A loader is only ever given the bytes that the store verified, as ``/proc/self/fd/N`` of
a sealed in-memory file (:func:`fa4cache.store.secure_io.loadable_path`), never a path in
the store or in a temp directory: nothing another user does to any directory between the
check and the load can change what runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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


# CuTe's dtype names -> the names warm, KernelSpec and the CLI use.
_SHORT_DTYPES = {
    "BFloat16": "bf16",
    "Float16": "fp16",
    "Float32": "fp32",
    "Float8E4M3FN": "fp8_e4m3",
    "Float8E5M2": "fp8_e5m2",
}


def short_dtype(name: str) -> str:
    return _SHORT_DTYPES.get(name, name)


def summary(kind: str, encoded: str) -> dict[str, Any]:
    """A few human-readable facts from the key text (for ``fa4cache ls``)."""

    try:
        key = json.loads(encoded)
    except ValueError:
        return {}
    out: dict[str, Any] = {}

    def walk(v: Any) -> Iterator[Any]:
        if isinstance(v, list):
            for x in v:
                yield from walk(x)
        else:
            yield v

    flat = list(walk(key))
    dtypes = [d["type"].rsplit(".", 1)[-1] for d in flat if isinstance(d, dict) and "type" in d]
    if dtypes:
        out["dtype"] = short_dtype(dtypes[0])
    ints = [int(d["i"]) for d in flat if isinstance(d, dict) and "i" in d]
    if kind in ("fwd", "bwd") and len(ints) >= 2:
        hd = [i for i in ints if i in (32, 64, 96, 128, 192, 256)]
        if hd:
            out["head_dim"] = hd[0]
    hashes = [v for v in flat if isinstance(v, str) and len(v) == 64]
    out["mask"] = hashes[0][:12] if hashes else None
    return out
