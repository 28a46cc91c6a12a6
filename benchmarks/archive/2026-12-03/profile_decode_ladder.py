"""Probe (H200): where an eager batch-1 decode step's time goes, as a ladder of attention
implementations that each add one part of fa4cache's step: ``null_attention`` (nothing),
``ranges`` (the step's key ranges, then nothing), ``nolaunch`` (fa4cache whole but the FA4
launch), ``fa4cache``, and ``sdpa``. Per step: the median interval between decode steps
(a logits processor's clock) in each run; runs in rotating order, the median over rounds.

    python benchmarks/profile_decode_ladder.py [--jobs llama-d64:1:128 ...] [--rounds 10]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import threading
import time
from typing import Any

from bench_generation import config, gen_kwargs, prompts
from profile_decode import NULL, register_null


def register_ladder() -> None:
    from fa4cache.adapters.transformers import padding_mask
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from fa4cache.ops import kv_cache

    def ranges(
        module: Any, query: Any, key: Any, value: Any, mask: Any, *a: Any, **kw: Any
    ) -> tuple[Any, None]:
        B, H, T, _ = query.shape
        if T == 1:
            kv_cache.sequences(mask, kw.get("position_ids"), B, key.shape[1], key.shape[2], share=True)
        return query.new_empty(B, T, H, value.shape[-1]), None

    AttentionInterface.register("ranges", ranges)
    AttentionMaskInterface.register("ranges", padding_mask)


class Clock:
    """A logits processor: the time of each decode step."""

    def __init__(self) -> None:
        self.t: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.t.append(time.perf_counter())
        return scores


def main() -> None:
    import torch
    from fa4cache.adapters.transformers import register
    from transformers import AutoModelForCausalLM, LogitsProcessorList

    from fa4cache.ops import launch_plans

    p = argparse.ArgumentParser()
    p.add_argument("--jobs", nargs="*", default=["llama-d64:1:128", "llama-d64:1:2048", "llama-d64:8:128"])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--new", type=int, default=128)
    a = p.parse_args()
    register()
    register_null()
    register_ladder()
    impls = ["sdpa", "fa4cache", NULL, "ranges", "nolaunch"]
    real_launch = launch_plans.Replay.launch
    out: list[dict[str, Any]] = []
    for job in a.jobs:
        shape, b, prompt = job.split(":")
        B, P = int(b), int(prompt)
        cfg = config(shape, 4)
        models = {}
        for impl in impls:
            torch.manual_seed(0)
            with torch.device("cuda"):
                models[impl] = AutoModelForCausalLM.from_config(
                    copy.deepcopy(cfg),
                    attn_implementation="fa4cache" if impl == "nolaunch" else impl,
                    dtype=torch.bfloat16,
                ).eval()
        ids, mask = prompts(B, P, cfg.vocab_size, 1, "cuda")

        def run(impl: str) -> float:
            clock = Clock()
            if impl == "nolaunch":
                launch_plans.Replay.launch = lambda self, t: None
            torch.cuda.synchronize()
            gc.collect()
            gc.disable()
            try:
                models[impl].generate(
                    ids,
                    attention_mask=mask,
                    logits_processor=LogitsProcessorList([clock]),
                    **gen_kwargs(a.new),
                )
                torch.cuda.synchronize()
            finally:
                gc.enable()
                launch_plans.Replay.launch = real_launch
            d = [y - x for x, y in zip(clock.t[1:], clock.t[2:])]
            return statistics.median(d) * 1000

        for impl in impls:
            run(impl)
            run(impl)
        per: dict[str, list[float]] = {i: [] for i in impls}
        for r in range(a.rounds):
            order = impls[r % len(impls) :] + impls[: r % len(impls)]
            if r % 2:
                order = order[::-1]
            for impl in order:
                per[impl].append(run(impl))
        row = {"job": job, "threads": threading.active_count(), "tasks": len(os.listdir("/proc/self/task"))}
        for impl in impls:
            row[impl] = round(statistics.median(per[impl]), 3)
            row[impl + "_all"] = [round(x, 3) for x in per[impl]]
        row["fa4cache_over_sdpa_rounds"] = sorted(
            round(s / f, 3) for s, f in zip(per["sdpa"], per["fa4cache"])
        )
        print(json.dumps(row), flush=True)
        out.append(row)
        models.clear()
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("FA4CACHE_RESULTS", "."), "decode_ladder_h200.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
