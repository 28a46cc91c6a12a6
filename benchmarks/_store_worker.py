"""One process of bench_store.py: time the first document-mask forward+backward.

MODE=fa4cache routes FA4's caches through fa4cache; MODE=fa4own uses FA4's own disk
cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1, set by the parent). Prints RESULT json.
"""

from __future__ import annotations

import json
import os
import sys
import time

mode = sys.argv[1]
T = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
if mode == "fa4cache":
    import fa4cache

    fa4cache.install()
import cutlass.cute as cute
import torch

compiles = {"n": 0, "s": 0.0}
_orig = cute.compile


def counting_compile(*a, **k):  # instrumentation only: counts real compiles in either mode
    t = time.perf_counter()
    try:
        return _orig(*a, **k)
    finally:
        compiles["n"] += 1
        compiles["s"] += time.perf_counter() - t


counting_compile.__fa4cache_codegen_neutral__ = True  # it counts and calls cute.compile: no other code
cute.compile = counting_compile
from flash_attn.cute import flash_attn_func  # noqa: E402
from flash_attn.cute import interface as fi  # noqa: E402

fi.cute.compile = counting_compile

from fa4cache.masks import make_document_mask  # noqa: E402

torch.manual_seed(int(os.environ.get("SEED", "0")))
lens = [T // 4, T // 2, T // 4]
cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
mask = make_document_mask(cu, seqlen=T)
q, k, v = (
    torch.randn(1, T, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
)
torch.cuda.synchronize()
if os.environ.get("WAIT_FILE"):
    while not os.path.exists(os.environ["WAIT_FILE"]):
        time.sleep(0.005)


def timed_step() -> float:
    t0 = time.perf_counter()
    out = flash_attn_func(q, k, v, **mask)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


first = timed_step()  # compiles or loads the kernels
second = timed_step()
print(
    "RESULT "
    + json.dumps(
        {
            "mode": mode,
            "first_s": first,
            "second_s": second,
            "compiles": compiles["n"],
            "compile_s": compiles["s"],
        }
    ),
    flush=True,
)
