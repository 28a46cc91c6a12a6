"""A tiny user CuTe-DSL kernel under ``@fa4cache.jit_cache`` (y = x * SCALE), for the tests.

``SCALE`` is a module constant the kernel reads; ``FA4CACHE_TEST_SCALE`` changes it in a
new process, which must compile a new entry.
"""

from __future__ import annotations

import os

import cutlass
import cutlass.cute as cute

import fa4cache

SCALE = float(os.environ.get("FA4CACHE_TEST_SCALE", "2.0"))
THREADS = 128


@cute.kernel
def _scale_kernel(x: cute.Tensor, y: cute.Tensor) -> None:
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < x.shape[0]:
        y[i] = (x[i] * SCALE).to(y.element_type)


@cute.jit
def _launch(x: cute.Tensor, y: cute.Tensor, stream: object) -> None:
    n = x.shape[0]
    _scale_kernel(x, y).launch(
        grid=((n + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream
    )


@fa4cache.jit_cache
def compile_scale(dtype: type, align: int = 16, tag: str = "") -> object:
    """``tag`` only changes the key (a test of argument spellings)."""
    n = cute.sym_int()
    x = cute.runtime.make_fake_tensor(dtype, (n,), stride=(1,), assumed_align=align)
    y = cute.runtime.make_fake_tensor(dtype, (n,), stride=(1,), assumed_align=align)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(_launch, x, y, stream, options="--enable-tvm-ffi")


DTYPES = (cutlass.Float32, cutlass.Float16, cutlass.BFloat16)
