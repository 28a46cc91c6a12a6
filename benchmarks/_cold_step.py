"""One process of bench_cold_start.py: the first document-mask forward+backward, timed from
after the imports (GPU).

    python benchmarks/_cold_step.py MODE PATH T

Heads, KV heads and head dim come from COLD_HEADS, COLD_KV_HEADS, COLD_D (default 16, 16, 128).
MODE: fa4cache (install(); FA4CACHE_COMPILE_AHEAD from the environment) or fa4own (FA4's own
disk cache, set up by the parent). PATH: varlen (fa4cache.attention) or dense (FA4's
flash_attn_func with the mask's kwargs). Waits for $WAIT_FILE after its imports, prints
``READY`` before that and ``RESULT <json>`` at the end. $COLD_PROFILE: cProfile the first
step into that file.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
t_start = time.perf_counter()
mode, path, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
H, HKV, D = (
    int(os.environ.get(v, d)) for v, d in (("COLD_HEADS", 16), ("COLD_KV_HEADS", 16), ("COLD_D", 128))
)
if mode == "fa4cache":
    import fa4cache

    store = fa4cache.install()
import cutlass.cute as cute
import torch

compiles = {"n": 0, "s": 0.0}
_orig = cute.compile


def counting_compile(*a, **k):  # instrumentation: real compiles in this process, either mode
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

import fa4cache as _fc  # noqa: E402
from fa4cache.masks import make_document_mask  # noqa: E402

lens = [T // 4, T // 2, T // 4]
cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
mask = make_document_mask(cu, seqlen=T)
q = torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(1, T, HKV, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
torch.cuda.synchronize()
import_s = time.perf_counter() - t_start
print("READY", flush=True)
if os.environ.get("WAIT_FILE"):
    while not os.path.exists(os.environ["WAIT_FILE"]):
        time.sleep(0.005)


try:  # benchmarks/phases/ on PYTHONPATH: the step's forward and backward go in its timeline
    from sitecustomize import _PATH, _record  # type: ignore[import-not-found]
except ImportError:
    _PATH = None


def step() -> float:
    t0 = time.perf_counter()
    w0 = time.time()
    if path == "dense":
        out = flash_attn_func(q, k, v, **mask)
        out = out[0] if isinstance(out, tuple) else out
    else:
        out = _fc.attention(q, k, v, mask)
    w1 = time.time()
    out.sum().backward()
    torch.cuda.synchronize()
    if _PATH:
        _record("step_forward", w0, w1)
        _record("step_backward", w1, time.time())
    return time.perf_counter() - t0


go_at = time.time()
if os.environ.get("COLD_PROFILE"):  # where a step goes, function by function (cProfile stats)
    import cProfile

    prof = cProfile.Profile()
    first = prof.runcall(step)
    prof.dump_stats(os.environ["COLD_PROFILE"])
else:
    first = step()
second = step()
res = {
    "mode": mode, "path": path, "first_s": first, "second_s": second, "compiles": compiles["n"],
    "compile_s": compiles["s"], "go_at": go_at, "import_s": import_s,
}  # fmt: skip
if mode == "fa4cache":
    store.counters.flush()
    res["counters"] = dict(store.counters.values)
print("RESULT " + json.dumps(res), flush=True)
