"""Probe (H200): why one step's key ranges (a Triton launch and a device check) cost an eager
batch-1 decode step far more than their host time in a loop; and the null-attention bound of
the static compiled path. Prints JSON lines; writes probe_decode_ranges_h200.json.

    python benchmarks/probe_decode_ranges.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import time
from typing import Any

from bench_generation import config, gen_kwargs, prompts, sync
from profile_decode import NULL, register_null
from profile_decode_ladder import Clock


def register_rungs(timers: dict[str, list[float]]) -> list[str]:
    import torch
    from fa4cache.adapters.transformers import padding_mask
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from fa4cache.ops import kv_cache

    def rung(name: str, first: Any) -> None:
        def fn(
            module: Any, query: Any, key: Any, value: Any, mask: Any, *a: Any, **kw: Any
        ) -> tuple[Any, None]:
            B, H, T, _ = query.shape
            if T == 1 and module.layer_idx == 0:
                t0 = time.perf_counter()
                first(mask, kw.get("position_ids"), B, key.shape[1], key.shape[2])
                timers.setdefault(name, []).append(time.perf_counter() - t0)
            return query.new_empty(B, T, H, value.shape[-1]), None

        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, padding_mask)

    def dev(m: Any, pos: Any) -> Any:
        return (m if m is not None else pos).device

    rung("ranges", lambda m, pos, B, h, k: kv_cache._sequences(m, pos, B, h, k))
    rung("nocheck", lambda m, pos, B, h, k: kv_cache._sequences(m, pos, B, h, k, check=False))

    def alloc_assert(m: Any, pos: Any, B: int, h: int, k: int) -> None:
        cu = torch.empty(B * h + 1, dtype=torch.int32, device=dev(m, pos))
        used = torch.empty(B * h, dtype=torch.int32, device=dev(m, pos))
        ok = torch.ones(B, dtype=torch.int32, device=dev(m, pos))
        torch._assert_async(ok.all(), "x")
        del cu, used

    rung("assertonly", alloc_assert)

    def one_kernel(m: Any, pos: Any, B: int, h: int, k: int) -> None:
        torch.arange(0, (B * h + 1) * k, k, dtype=torch.int32, device=dev(m, pos))

    rung("onekernel", one_kernel)
    return ["ranges", "nocheck", "assertonly", "onekernel"]


def build(cfg: Any, impls: list[str], device: str) -> dict[str, Any]:
    """One model per implementation, the same weights (seed 0; the config copied: transformers
    writes ``attn_implementation`` into the object it is given)."""
    import torch
    from transformers import AutoModelForCausalLM

    models = {}
    for impl in impls:
        torch.manual_seed(0)
        with torch.device(device):
            models[impl] = AutoModelForCausalLM.from_config(
                copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16
            ).eval()
    return models


def eager(a: Any, out: list[dict[str, Any]]) -> None:
    import torch
    from bench_generation import timed_attention
    from transformers import LogitsProcessorList

    timers: dict[str, list[float]] = {}
    impls = [i for i in [NULL, *register_rungs(timers), "fa4cache", "sdpa"] if i not in a.skip]
    for job in a.jobs:
        shape, b, prompt = job.split(":")
        B, P = int(b), int(prompt)
        cfg = config(shape, 4)
        models = build(cfg, impls, a.device)
        ids, mask = prompts(B, P, cfg.vocab_size, 1, a.device)

        def run(impl: str) -> float:
            clock = Clock()
            sync()
            gc.collect()
            gc.disable()
            try:
                models[impl].generate(
                    ids,
                    attention_mask=mask,
                    logits_processor=LogitsProcessorList([clock]),
                    **gen_kwargs(a.new),
                )
                sync()
            finally:
                gc.enable()
            d = [y - x for x, y in zip(clock.t[1:], clock.t[2:])]
            return statistics.median(d) * 1000

        for impl in impls:
            run(impl)
            run(impl)
        timers.clear()
        per: dict[str, list[float]] = {i: [] for i in impls}
        for r in range(a.rounds):
            order = impls[r % len(impls) :] + impls[: r % len(impls)]
            if r % 2:
                order = order[::-1]
            for impl in order:
                per[impl].append(run(impl))
        row: dict[str, Any] = {"job": job}
        for impl in impls:
            row[impl] = round(statistics.median(per[impl]), 3)
            row[impl + "_minus_null"] = round(
                statistics.median(x - y for x, y in zip(per[impl], per[NULL])), 3
            )
        row["first_layer_host_us"] = {k: round(statistics.median(v) * 1e6, 1) for k, v in timers.items()}
        # Host µs of each layer's attention call inside generate, layer 0 and the others.
        layers = cfg.num_hidden_layers
        for impl in [i for i in ("fa4cache", "sdpa", NULL) if i in impls]:
            times, undo = timed_attention(impl)
            try:
                run(impl)
            finally:
                undo()
            dec = times[layers:]
            row[impl + "_layer0_us"] = round(statistics.median(dec[0::layers]) * 1e6, 1)
            row[impl + "_layers1+_us"] = round(
                statistics.median([t for i, t in enumerate(dec) if i % layers]) * 1e6, 1
            )
        # What the host does more in a step with the key ranges: torch.profiler's CPU ops.
        from torch.profiler import ProfilerActivity, profile

        for impl in [i for i in (NULL, "ranges", "fa4cache", "sdpa") if i in impls]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run(impl)
            top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]
            row["cpu_ops_" + impl] = [(e.key, e.count, round(e.self_cpu_time_total / 1e3, 2)) for e in top]
        print(json.dumps(row), flush=True)
        out.append(row)
        models.clear()
        torch.cuda.empty_cache()


def compiled_bound(a: Any, out: list[dict[str, Any]]) -> None:
    """Static cache under transformers' compile: null attention (the bound) vs fa4cache vs sdpa."""
    import torch
    from bench_generation import graph_replays, run_once

    # Three models compiled in one process: room for each one's graphs (dynamo's default
    # limit of 8 per code object could send a later model back to eager).
    torch._dynamo.config.recompile_limit = 64
    for job in a.compiled:
        shape, b, prompt = job.split(":")
        B, P = int(b), int(prompt)
        cfg = config(shape, 4)
        ids, mask = prompts(B, P, cfg.vocab_size, 1, a.device)
        impls = [i for i in ("sdpa", "fa4cache", NULL) if i not in a.skip]
        models = build(cfg, impls, a.device)
        t: dict[str, list[float]] = {i: [] for i in impls}
        replays: dict[str, int] = {}
        try:
            for impl in impls:
                for _ in range(2):
                    run_once("static_compiled", models[impl], ids, mask, a.new)
            for r in range(3):
                for impl in impls if r % 2 == 0 else impls[::-1]:
                    with graph_replays() as n:
                        secs, toks = run_once("static_compiled", models[impl], ids, mask, a.new)
                    t[impl].append(toks / secs)
                    replays[impl] = n[0]
            row = {
                "job": "static_compiled:" + job,
                **{i: round(statistics.median(v), 1) for i, v in t.items()},
            }
            row["graph_replays_per_run"] = replays
            row["null_over_sdpa"] = round(row[NULL] / row["sdpa"], 3)
            if "fa4cache" in row:
                row["fa4cache_over_sdpa"] = round(row["fa4cache"] / row["sdpa"], 3)
        except Exception as e:
            row = {"job": "static_compiled:" + job, "error": f"{type(e).__name__}: {e}"[:400]}
        print(json.dumps(row), flush=True)
        out.append(row)
        models.clear()
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def main() -> None:
    from fa4cache.adapters.transformers import register

    p = argparse.ArgumentParser()
    p.add_argument("--jobs", nargs="*", default=["llama-d64:1:128"])
    p.add_argument("--compiled", nargs="*", default=["llama-d64:1:2048", "qwen3-4b:1:2048"])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--device", default="cuda")
    p.add_argument("--skip", nargs="*", default=[], help="implementations left out (a CPU check)")
    a = p.parse_args()
    register()
    register_null()
    out: list[dict[str, Any]] = []
    eager(a, out)
    a.new = 256
    compiled_bound(a, out)
    with open(
        os.path.join(os.environ.get("FA4CACHE_RESULTS", "."), "probe_decode_ranges_h200.json"), "w"
    ) as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
