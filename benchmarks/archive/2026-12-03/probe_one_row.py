"""Where an eager batch-1 ``generate`` spends its time, by phase: the prefill forward alone,
the decode loop alone (256 steps over a dynamic cache, as ``generate`` feeds them), and the
whole ``generate``; for fa4cache with its one-row path (SDPA's kernel at one row without
padding: :mod:`fa4cache.ops.one_row_decode`), fa4cache with it off (FA4 in every step), and
sdpa. Every side warmed by two full runs, then ``--rounds`` rounds in rotating order; medians.

    python benchmarks/probe_one_row.py [--shapes llama-d64 qwen3-4b] [--prompts 128 2048]

Writes probe_one_row.{md,json} under $FA4CACHE_RESULTS (or $OUT/results).
``--device cpu --shapes tiny`` runs it on the CPU (the one-row path needs CUDA: it is off there).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
from pathlib import Path
from typing import Any

from bench_generation import cache_kwarg, config, gen_kwargs, prompts, timed
from common import save, table

SIDES = ("fa4cache", "fa4cache-fa4", "sdpa")


def side_env(side: str) -> None:
    """fa4cache's one-row path on or off for this side (read per step)."""
    os.environ["FA4CACHE_ONE_ROW_SDPA"] = "0" if side == "fa4cache-fa4" else "1"


def prefill(model: Any, ids: Any, mask: Any) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, **{cache_kwarg(): cache})
    return out.logits[:, -1:].argmax(-1), cache


def decode_loop(model: Any, ids: Any, mask: Any, steps: int) -> Any:
    """``steps`` greedy decode steps after an untimed prefill, as ``generate`` feeds them
    (the mask grown by one column per step; position_ids from it)."""
    import torch

    nxt, cache = prefill(model, ids, mask)

    def loop() -> None:
        nonlocal nxt, mask
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            pos = mask.sum(-1, keepdim=True) - 1
            out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, **{cache_kwarg(): cache})
            nxt = out.logits[:, -1:].argmax(-1)

    return loop


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="*", default=["llama-d64", "qwen3-4b"])
    p.add_argument("--prompts", nargs="*", type=int, default=[128, 2048])
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--qwen-layers", type=int, default=4)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    if "FA4CACHE_RESULTS" not in os.environ and os.environ.get("OUT"):
        os.environ["FA4CACHE_RESULTS"] = str(Path(os.environ["OUT"]) / "results")

    import torch
    from fa4cache.adapters import transformers as fht
    from transformers import AutoModelForCausalLM

    import fa4cache

    fht.register()
    fa4cache.install()
    rows: list[dict[str, Any]] = []
    for shape in a.shapes:
        cfg = config(shape, a.qwen_layers)
        models = {}
        for impl in ("fa4cache", "sdpa"):
            torch.manual_seed(0)
            with torch.device(a.device):
                models[impl] = AutoModelForCausalLM.from_config(
                    copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16
                ).eval()
        for P in a.prompts:
            ids, mask = prompts(1, P, cfg.vocab_size, seed=P, device=a.device)
            times: dict[str, dict[str, list[float]]] = {
                s: {"prefill": [], "loop": [], "generate": []} for s in SIDES
            }
            with torch.no_grad():
                for side in SIDES:  # warm-up: two full runs each
                    side_env(side)
                    m = models[side.split("-")[0]]
                    for _ in range(2):
                        m.generate(ids, attention_mask=mask, **gen_kwargs(a.new))
                for r in range(a.rounds):
                    order = SIDES[r % 3 :] + SIDES[: r % 3]
                    for side in order:
                        side_env(side)
                        m = models[side.split("-")[0]]
                        times[side]["prefill"].append(timed(lambda: prefill(m, ids, mask))[0])
                        times[side]["loop"].append(timed(decode_loop(m, ids, mask, a.new))[0])
                        t, _ = timed(lambda: m.generate(ids, attention_mask=mask, **gen_kwargs(a.new)))
                        times[side]["generate"].append(t)
            os.environ.pop("FA4CACHE_ONE_ROW_SDPA", None)
            for side in SIDES:
                row = {"shape": shape, "prompt": P, "side": side}
                row["prefill ms"] = round(statistics.median(times[side]["prefill"]) * 1e3, 2)
                row["loop ms/step"] = round(statistics.median(times[side]["loop"]) / a.new * 1e3, 3)
                row["generate ms/step"] = round(statistics.median(times[side]["generate"]) / a.new * 1e3, 3)
                row["generate s (rounds)"] = " ".join(f"{x:.3f}" for x in times[side]["generate"])
                rows.append(row)
                print(row, flush=True)
    data = {"args": vars(a), "rows": rows}
    headers = list(rows[0]) if rows else []
    save(
        "probe_one_row",
        "Eager batch-1 generate by phase: fa4cache (one-row path), fa4cache with FA4 in every step, sdpa",
        [(f"{a.rounds} rounds in rotating order, medians; {a.new} new tokens; `python benchmarks/probe_one_row.py`",
          table(headers, [[r[h] for h in headers] for r in rows]))],
        data,
    )  # fmt: skip
    return data


if __name__ == "__main__":
    main()
