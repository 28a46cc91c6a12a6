"""A real process that runs user-code cases against a store, for ``tests/test_identity_kernels.py``.

Usage: ``python -m tests.helpers.identity_runner CASES_DIR NAME [NAME ...]``. Each ``NAME`` is a
folder of ``CASES_DIR`` holding a ``main_<NAME>.py`` whose ``run()`` calls FA4 (a forward on
fake CUDA tensors, cross-compiled for sm_90) or a ``@fa4cache.jit_cache`` kernel, the way
user code does. Prints one ``RESULT`` JSON line: per case, what the store counted.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")

FIELDS = ("compiles", "disk_hits", "memory_only_compiles")


def fa4_forward(mask_mod: object, head_dim: int = 64) -> None:
    """One FA4 forward with ``mask_mod`` on fake CUDA tensors (compiles or loads its kernel)."""
    import torch
    from flash_attn.cute import interface as fi
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 256, 2, head_dim, dtype=torch.bfloat16, device="cuda")
        fi._flash_attn_fwd(q, q, q, mask_mod=mask_mod, return_lse=True)


def fa4_forward_backward(mask_mod: object, head_dim: int = 64, backward: bool = True) -> None:
    """A forward (and its backward) with ``mask_mod``, as autograd would call them."""
    import torch
    from flash_attn.cute import interface as fi
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 256, 2, head_dim, dtype=torch.bfloat16, device="cuda")
        out, lse, *_ = fi._flash_attn_fwd(q, q, q, mask_mod=mask_mod, return_lse=True)
        if backward:
            fi._flash_attn_bwd(q, q, q, out, torch.empty_like(out), lse, mask_mod=mask_mod)


def main() -> None:
    cases_dir, names = sys.argv[1], sys.argv[2:]
    import fa4cache

    store = fa4cache.install()
    out: dict[str, dict[str, float]] = {}
    for name in names:
        sys.path.insert(0, os.path.join(cases_dir, name))
        before = dict(store.counters.values)
        importlib.import_module(f"main_{name}").run()
        out[name] = {f: store.counters.values.get(f, 0) - before.get(f, 0) for f in FIELDS}
    from fa4cache.adapters.compile import server as compile_server

    # Compile servers this process started (compile-ahead, FA4CACHE_VERIFY_HITS).
    out["_process"] = {"servers": len(compile_server._live)}
    store.counters.flush()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
