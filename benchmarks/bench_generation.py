"""Decoding through transformers' ``generate`` on one GPU: ``attn_implementation="fa4cache"``
(KV-cache steps on FA4) against "sdpa" and transformers' own "flash_attention_4" (with
``register()``'s fix), and ``generate_batch`` (continuous batching, paged cache) where it runs.

Model: Qwen3-4B's shape (hidden 2560, 32 query / 8 KV heads of 128, MLP 9728, vocab
151936) with random bf16 weights and ``--layers`` layers (default 12 of its 36, to keep
the run within ~3 minutes; per-layer attention work is the same). Prompts: ``--prompts``
(32 and 64) of 128-512 random tokens, left padded; ``--new`` (512) new tokens each, greedy,
no early stop. Decode tokens/s = prompts x (new - 1) / (time of generate(new) - time of
generate(1)): the prefill is taken out. Compiles: FA4 kernels compiled after a warm-up
generate at the first batch size (``fa4cache.stats()`` counters; 0 is the target).

    python benchmarks/bench_generation.py [--layers 12] [--prompts 32 64] [--new 512]

Writes generation_h200.{md,json} under $FA4CACHE_RESULTS (or $OUT/results, or
benchmarks/results).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import random
import time
from pathlib import Path
from typing import Any

from common import save, table

ANCHOR = "sdpa"


def _compiles(store: Any) -> int:
    from fa4cache.adapters.flash_attn import fold_all_hits

    fold_all_hits()
    store.counters.flush()
    return int(store.counters.values["compiles"])


def _prompts(n: int, vocab: int, seed: int) -> tuple[Any, Any]:
    import torch

    rng = random.Random(seed)
    lens = [rng.randint(128, 512) for _ in range(n)]
    T = max(lens)
    ids = torch.randint(0, vocab, (n, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(n, T, dtype=torch.long)
    for b, n_b in enumerate(lens):
        mask[b, T - n_b :] = 1
    return ids.masked_fill(mask == 0, 0).cuda(), mask.cuda()


def _timed(fn: Any) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _generate_rate(model: Any, ids: Any, mask: Any, new: int) -> dict[str, Any]:
    kw = {"attention_mask": mask, "do_sample": False, "pad_token_id": 0}
    first = _timed(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw))
    full = _timed(lambda: model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw))
    tokens = ids.shape[0] * (new - 1)
    return {
        "seconds": full,
        "prefill_seconds": first,
        "decode_tokens_per_s": tokens / max(full - first, 1e-9),
    }


def _generate_batch_rate(model: Any, ids: Any, mask: Any, new: int) -> dict[str, Any]:
    """``generate_batch`` over the same prompts (unpadded): decode tokens/s over its whole
    run (prefill included: continuous batching interleaves it)."""
    from transformers import GenerationConfig

    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    cfg = GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=-1
    )
    seconds = _timed(lambda: model.generate_batch(inputs=prompts, generation_config=cfg, progress_bar=False))
    return {"seconds": seconds, "decode_tokens_per_s": len(prompts) * new / seconds}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--prompts", type=int, nargs="+", default=[32, 64])
    p.add_argument("--new", type=int, default=512)
    p.add_argument("--impls", nargs="+", default=["fa4cache", "sdpa", "flash_attention_4"])
    p.add_argument(
        "--batch-impls", nargs="*", default=["fa4cache", "sdpa"], help="generate_batch runs (paged cache)"
    )
    p.add_argument("--budget", type=float, default=150.0, help="seconds after which further runs are skipped")
    a = p.parse_args()
    if "FA4CACHE_RESULTS" not in os.environ and os.environ.get("OUT"):
        os.environ["FA4CACHE_RESULTS"] = str(Path(os.environ["OUT"]) / "results")

    import torch
    from fa4cache.adapters import transformers as fht
    from transformers import AutoModelForCausalLM, Qwen3Config

    import fa4cache

    fht.register()
    store = fa4cache.install()
    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=a.layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        tie_word_embeddings=True,
    )  # fmt: skip
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"layers": a.layers, "new_tokens": a.new, "runs": []}
    compiles_at: dict[str, int] = {}
    t_start = time.perf_counter()

    def build(impl: str) -> Any:
        torch.manual_seed(0)
        with torch.device("cuda"):  # random init on the GPU: seconds, not a minute on the CPU
            model = AutoModelForCausalLM.from_config(
                copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16
            )
        return model.eval()

    def over_budget(what: str) -> bool:
        if time.perf_counter() - t_start < a.budget:
            return False
        data["runs"].append({"api": what, "impl": "-", "error": f"skipped: past --budget {a.budget} s"})
        return True

    for impl in a.impls:
        model = None
        if over_budget(f"generate {impl}"):
            continue
        try:
            model = build(impl)
            data["parameters"] = sum(x.numel() for x in model.parameters())
            ids, mask = _prompts(a.prompts[0], cfg.vocab_size, 0)
            # Warm-up: every kernel of the first batch size (prefill and decode).
            model.generate(
                ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0
            )
            if impl == "fa4cache":
                compiles_at["after warm-up"] = _compiles(store)
            for n in a.prompts:
                ids, mask = _prompts(n, cfg.vocab_size, n)
                r = _generate_rate(model, ids, mask, a.new)
                data["runs"].append({"api": "generate", "impl": impl, "prompts": n, **r})
        except torch.OutOfMemoryError:
            data["runs"].append({"api": "generate", "impl": impl, "error": "out of memory"})
        except Exception as e:  # reported, not fatal: the other implementations still run
            data["runs"].append(
                {"api": "generate", "impl": impl, "error": f"{type(e).__name__}: {str(e)[:160]}"}
            )
        if impl == "fa4cache":
            compiles_at["after all generate runs"] = _compiles(store)
        del model
        gc.collect()
        torch.cuda.empty_cache()
        print(f"{impl} done at {time.perf_counter() - t_start:.0f} s", flush=True)
    for impl in a.batch_impls:
        model = None
        if over_budget(f"generate_batch {impl}"):
            continue
        try:
            model = build(impl)
            for n in a.prompts:
                ids, mask = _prompts(n, cfg.vocab_size, n)
                r = _generate_batch_rate(model, ids, mask, a.new)
                data["runs"].append({"api": "generate_batch", "impl": impl, "prompts": n, **r})
        except Exception as e:
            data["runs"].append(
                {"api": "generate_batch", "impl": impl, "error": f"{type(e).__name__}: {str(e)[:160]}"}
            )
        del model
        gc.collect()
        torch.cuda.empty_cache()
        print(f"generate_batch {impl} done at {time.perf_counter() - t_start:.0f} s", flush=True)
    if "fa4cache" in a.batch_impls:
        compiles_at["after generate_batch"] = _compiles(store)

    anchors = {
        (r["api"], r["prompts"]): r["decode_tokens_per_s"]
        for r in data["runs"]
        if r.get("impl") == ANCHOR and "decode_tokens_per_s" in r
    }
    for r in data["runs"]:
        if "error" in r:
            rows.append([r["api"], r.get("prompts", ""), r["impl"], r["error"], "", ""])
            continue
        base = anchors.get((r["api"], r["prompts"]))
        ratio = f"{r['decode_tokens_per_s'] / base:.2f}x" if base else ""
        rows.append(
            [
                r["api"],
                r["prompts"],
                r["impl"],
                f"{r['seconds']:.1f}",
                f"{r['decode_tokens_per_s']:.0f}",
                ratio,
            ]
        )
    data["fa4cache_compiles"] = compiles_at
    warm = compiles_at.get("after warm-up")
    after = {k: v - warm for k, v in compiles_at.items() if warm is not None and k != "after warm-up"}
    data["compiles_after_warm_up"] = after
    params = data.get("parameters", 0) / 1e9
    save(
        "generation_h200",
        f"Decoding through transformers, Qwen3-4B shape with {a.layers} layers ({params:.2f}B parameters), "
        f"random bf16 weights, {a.new} new tokens",
        [
            (
                "Decode tokens/s (generate: prefill time taken out; generate_batch: whole run; "
                f"x: over {ANCHOR} for the same API and prompts)",
                table(
                    ["API", "prompts", "attn_implementation", "seconds", "decode tok/s", f"vs {ANCHOR}"], rows
                ),
            ),
            (
                "FA4 kernels compiled by fa4cache after the warm-up (target 0)",
                ", ".join(f"{k}: {v}" for k, v in after.items()) or "n/a",
            ),
        ],
        data,
    )


if __name__ == "__main__":
    main()
