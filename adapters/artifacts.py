"""FA4 kernels as store artifacts: export a compiled kernel to an object file, load one back.

A loader is only ever given a private copy of the bytes that the store verified (in a
fresh 0700 directory), never the store's own path, so nothing that happens to the store
between the check and the load can change what runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fa4cache.store.secure_io import private_copy, remove_private_copy
from fa4cache.store.store import Artifact

EXPORT_FUNCTION = "func"


def export(fn: Any, path: Path) -> bool:
    """Write compiled ``fn`` as an object file at ``path``; whether it is a TVM-FFI function."""
    fn.export_to_c(object_file_path=str(path), function_name=EXPORT_FUNCTION)
    return "TVMFFI" in type(fn).__name__ or "tvm_ffi" in type(fn).__module__


def load_callable(art: Artifact) -> Any:
    import cutlass.cute as cute

    path = private_copy(art.data, f"{art.ref.digest}.{os.getpid()}.o")
    try:
        module = cute.runtime.load_module(str(path), enable_tvm_ffi=art.sidecar.tvm_ffi)
        return getattr(module, EXPORT_FUNCTION)
    finally:
        remove_private_copy(path)


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
