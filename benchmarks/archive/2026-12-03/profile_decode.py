"""Where an eager decode step spends its time on the GPU host: transformers' ``generate``
(dynamic cache) with ``"fa4cache"`` against ``"sdpa"`` and ``"null_attention"`` (attention
that does nothing: the model's own step, the floor under any implementation's), each
warmed to steady state first.

Per implementation and shape, printed and saved:

* inside ``generate`` (:func:`bench_generation.step_profile`): the attention call's host µs
  per layer, kernel launches, kernels per layer, host syncs and GPU busy ms per step;
* one attention call alone, at the step's shapes: host µs (launch rate) and GPU µs per
  call; for fa4cache also FA4's compiled kernel called directly (the floor of a launch
  through FA4's TVM-FFI entry) and ``_flash_attn_fwd``'s Python around it;
* cProfile of steady-state decode steps: the functions with the most own time.

    python benchmarks/profile_decode.py [--jobs llama-d64:32:2048 ...] [--new 64]

Writes decode_profile_h200.{md,json} under $FA4CACHE_RESULTS (or benchmarks/results).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from bench_generation import config, gen_kwargs, prompts, run_once, step_profile, sync
from common import save, table

NULL = "null_attention"


def register_null() -> None:
    """``"null_attention"``: attention that costs one allocation (its output), with fa4cache's
    2-D mask hook. A step with it is the model's step without attention: the floor any
    attention implementation's eager step stands on (the bound of a ratio over sdpa)."""
    from fa4cache.adapters.transformers import padding_mask
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    def null(module: Any, query: Any, key: Any, value: Any, *a: Any, **kw: Any) -> tuple[Any, None]:
        B, H, T, _ = query.shape
        return query.new_empty(B, T, H, value.shape[-1]), None

    AttentionInterface.register(NULL, null)
    AttentionMaskInterface.register(NULL, padding_mask)


def _model(shape: str, impl: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(copy.deepcopy(config(shape, 4)), attn_implementation=impl,
                                             dtype=torch.bfloat16)  # fmt: skip
    return m.eval()


def _cprofile(m: Any, ids: Any, mask: Any, new: int, top: int = 22) -> str:
    pr = cProfile.Profile()
    sync()
    pr.enable()
    m.generate(ids, attention_mask=mask, **gen_kwargs(new))
    sync()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
    # Shorten site-packages paths to package-relative ones.
    return "\n".join(ln.replace(str(Path(os.__file__).parent), "<py>").split("site-packages/")[-1]
                     if "site-packages/" in ln else ln for ln in lines)  # fmt: skip


def _loop_us(fn: Any, n: int = 300) -> tuple[float, float]:
    """(host µs per call with no sync between calls, wall µs per call once the GPU is done)."""
    for _ in range(20):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def _gpu_us(fn: Any, n: int = 100) -> float:
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3


def _micro(shape: str, B: int, Tk: int) -> dict[str, Any]:
    """One layer's attention call at a decode step's shapes."""
    import torch
    from fa4cache.adapters.fa4 import compile_cache as cc
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from fa4cache.ops import kv_cache

    cfg = config(shape, 4)
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, Tk, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, Tk, D, device="cuda", dtype=torch.bfloat16, generator=g)
    mask2 = torch.ones(B, Tk, device="cuda", dtype=torch.long)
    mask2[1:, :7] = 0
    scale = D**-0.5
    out: dict[str, Any] = {}

    def fa4_step() -> Any:
        return kv_cache.forward(q, k, v, mask2, None, True, None, scale, 0.0, True, share=True)

    # The kernel FA4 calls, captured from the compile cache on one call, then called alone.
    captured: dict[str, Any] = {}
    orig = cc.StoreCompileCache.__getitem__

    def getitem(self: Any, key: Any) -> Any:
        fn = orig(self, key)

        def call(*a: Any, **kw: Any) -> Any:
            captured["call"] = (fn, a, kw)
            return fn(*a, **kw)

        return call

    from fa4cache.ops import launch_plans

    launch_plans.clear()  # the first call below is planned by FA4 (and observed here)
    cc.StoreCompileCache.__getitem__ = getitem  # type: ignore[method-assign]
    try:
        ref = fa4_step().clone()
    finally:
        cc.StoreCompileCache.__getitem__ = orig  # type: ignore[method-assign]
    out["fa4cache host/wall us"] = _loop_us(fa4_step)
    out["fa4cache gpu us"] = _gpu_us(fa4_step)
    out["replayed == FA4 whole (bitwise)"] = str(bool(torch.equal(fa4_step(), ref)))
    os.environ["FA4CACHE_LAUNCH_PLANS"] = "0"
    try:
        out["fa4cache, plans off host/wall us"] = _loop_us(fa4_step)
    finally:
        del os.environ["FA4CACHE_LAUNCH_PLANS"]
    if "call" in captured:
        fn, a, kw = captured["call"]
        out["FA4 kernel call alone host/wall us"] = _loop_us(lambda: fn(*a, **kw))
    # The step's key ranges (the first layer's cost; later layers share them).
    out["key ranges (Triton) host us"] = _loop_us(lambda: kv_cache._sequences(mask2, None, B, Hkv, Tk))[0]
    os.environ["FA4CACHE_TRITON"] = "0"
    try:
        out["key ranges (PyTorch) host us"] = _loop_us(lambda: kv_cache._sequences(mask2, None, B, Hkv, Tk))[
            0
        ]
        torch_form = kv_cache._sequences(mask2, None, B, Hkv, Tk)
    finally:
        del os.environ["FA4CACHE_TRITON"]
    tri = kv_cache._sequences(mask2, None, B, Hkv, Tk)
    out["key ranges Triton == PyTorch"] = str(all(torch.equal(x, y) for x, y in zip(tri, torch_form)))
    from flash_attn.cute import interface as fi

    cu, used = kv_cache._sequences(mask2, None, B, Hkv, Tk)
    n = B * Hkv
    qq = kv_cache._query_view(q, B, Hkv, Hq // Hkv, 1, D)  # the layout fa4cache hands FA4
    kk, vv = k.reshape(n * Tk, 1, D), v.reshape(n * Tk, 1, D)
    res = q.new_empty(n, 1, Hq // Hkv, D)

    def fa4_only() -> Any:
        return fi._flash_attn_fwd(qq, kk, vv, cu_seqlens_k=cu, seqused_k=used, max_seqlen_q=1, max_seqlen_k=Tk,
                                  softmax_scale=scale, causal=True, out=res)  # fmt: skip

    out["_flash_attn_fwd host/wall us"] = _loop_us(fa4_only)

    class Mod(torch.nn.Module):
        num_key_value_groups = Hq // Hkv
        is_causal = True
        training = False

    mod = Mod()
    m4 = mask2.bool()[:, None, None, :]

    def sdpa_step() -> Any:
        return sdpa_attention_forward(mod, q, k, v, m4, scaling=scale)

    want = sdpa_step()[0]
    out["max |fa4cache - sdpa|"] = float((ref.float() - want.float()).abs().max())
    out["sdpa host/wall us"] = _loop_us(sdpa_step)
    out["sdpa gpu us"] = _gpu_us(sdpa_step)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", nargs="*", default=["llama-d64:32:2048", "llama-d64:32:128"])
    p.add_argument("--impls", nargs="*", default=["fa4cache", "sdpa", NULL])
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    if "FA4CACHE_RESULTS" not in os.environ and os.environ.get("OUT"):
        os.environ["FA4CACHE_RESULTS"] = str(Path(os.environ["OUT"]) / "results")
    import torch
    from fa4cache.adapters import transformers as fht

    import fa4cache

    fht.register()
    register_null()
    fa4cache.install()
    data: dict[str, Any] = {"args": vars(a), "jobs": {}}
    rows, micro_rows, cprofiles = [], [], []
    for job in a.jobs:
        shape, b, pr = job.split(":")
        B, P = int(b), int(pr)
        ids, mask = prompts(B, P, config(shape, 4).vocab_size, seed=B * 7919 + P, device="cuda")
        res: dict[str, Any] = {}
        models = {impl: _model(shape, impl) for impl in a.impls}
        with torch.no_grad():
            for m in models.values():
                for _ in range(2):
                    run_once("generate", m, ids, mask, a.new)
            times: dict[str, list[float]] = {i: [] for i in a.impls}
            for r in range(a.repeats):
                for impl in a.impls if r % 2 == 0 else a.impls[::-1]:
                    times[impl].append(run_once("generate", models[impl], ids, mask, a.new)[0])
            for impl, m in models.items():
                res[impl] = {"ms_per_step": statistics.median(times[impl]) / a.new * 1e3,
                             **step_profile(m, impl, ids, mask, a.new)}  # fmt: skip
                rows.append([job, impl, *(round(v, 2) for v in res[impl].values())])
                cprofiles.append(f"### {job} {impl}\n\n```\n{_cprofile(m, ids, mask, a.new)}\n```\n")
            try:
                res["micro"] = _micro(shape, B, P + a.new // 2)
            except Exception as e:  # a row, not the end of the run
                res["micro"] = {"error": f"{type(e).__name__}: {e}"}
            micro_rows.append(
                [
                    job,
                    "; ".join(
                        f"{k}: {v if isinstance(v, str) else _fmt(v)}" for k, v in res["micro"].items()
                    ),
                ]
            )
        data["jobs"][job] = res
        del models
        torch.cuda.empty_cache()
        print(job, {k: v for k, v in res.items() if k != "micro"}, res.get("micro"), flush=True)
    cols = ["job", "impl", "ms/step (generate, median)", "attention host µs/layer", "launches/step",
            "kernels/layer", "syncs/step", "GPU busy ms/step", "wall ms/step (profiled)"]  # fmt: skip
    sections = [
        ("Command", f"`python benchmarks/profile_decode.py --jobs {' '.join(a.jobs)} --new {a.new}`"),
        ("Inside generate", table(cols, rows)),
        ("One attention call alone, at the step's shapes", table(["job", "measurements"], micro_rows)),
        ("cProfile of one steady-state generate (own time)", "\n".join(cprofiles)),
    ]
    save("decode_profile_h200", "An eager decode step on the H200 host: where the time goes (steady state, dynamic cache)",
         sections, data)  # fmt: skip
    return data


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return "/".join(f"{x:.1f}" for x in v)
    return f"{v:.3g}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
