"""Preloaded by the run-as-user server (:mod:`tests.helpers.as_user`) for tests whose users load real
kernels: the CuTe DSL and the runtime libraries its loader opens, so that a user who cannot
read the venv (CI keeps it under /root) still loads kernels after the fork."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import cutlass.cute as cute
import tvm_ffi  # noqa: F401  (the loader imports it for TVM-FFI kernels)

_runtime = sys.modules[cute.runtime.load_module.__module__]
for _tvm in (False, True):
    for _path in _runtime.find_runtime_libraries(enable_tvm_ffi=_tvm):
        if _path not in _runtime._LOAD_MODULE_LIBS_CACHE and Path(_path).exists():
            _runtime._LOAD_MODULE_LIBS_CACHE[_path] = ctypes.CDLL(_path)
