"""A training step (forward + backward) of a random-init ~0.44B Qwen3-style model on packed
batches, through transformers with attn_implementation "fa4cache", "sdpa" and "flex_attention".

Same batches for every implementation: 16K and 64K tokens of random documents (lengths
uniform in --doc-range, 128-4096 tokens by default) in one packed row, position_ids restarting at each document (what
DataCollatorWithFlattening produces), labels = input ids. Reports tokens/s (median of the
timed steps after warm-up); an out-of-memory or other failure is reported as such.

    python benchmarks/bench_transformers.py [--lengths 16384 65536] [--compile] [--doc-range 128 4096]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

from common import causal_pairs, doc_lengths, save, table

# The anchors of the speed targets: fa4cache is compared with the faster of the two.
ANCHORS = ("sdpa", "flex_attention")


def profile_step(model: Any, ids: Any, pos: Any, tag: str) -> float:
    """One step under torch.profiler: the kernels that take the GPU time, and how much of
    the step's wall time the GPU was busy (saved as results/transformers_profile_<tag>.txt).
    Returns the GPU milliseconds of fa4cache's attention ops (their kernels included)."""
    import os
    from pathlib import Path

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        loss = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
        loss.backward()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    text = (
        f"step wall {wall * 1e3:.1f} ms (under the profiler), GPU kernel time {gpu_us / 1e3:.1f} ms\n\n"
        + events.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70)
    )
    out = Path(os.environ.get("FA4CACHE_RESULTS", Path(__file__).resolve().parent / "results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"transformers_profile_{tag}.txt").write_text(text)
    print(f"profile {tag}: wall {wall * 1e3:.1f} ms, GPU kernels {gpu_us / 1e3:.1f} ms", flush=True)
    ops = ("fa4cache::packed_attention", "fa4cache::packed_attention_backward")
    return sum(e.device_time_total for e in events if e.key in ops) / 1e3


# H200 SXM dense BF16 tensor-core peak (NVIDIA's datasheet: 1,979 TFLOP/s with sparsity).
H200_PEAK_FLOPS = 989.4e12


def attention_flops(lens: list[int], cfg: Any) -> float:
    """Forward+backward FLOPs of exact causal attention over the documents, every layer:
    2 matmuls forward, 5 backward, 2 * head_dim FLOPs per visible (query, key) pair each."""
    return 14 * cfg.head_dim * cfg.num_attention_heads * causal_pairs(lens) * cfg.num_hidden_layers


def load(layers: int) -> Any:
    """Register fa4cache and the "null" attention with transformers, install fa4cache; the model config."""
    from fa4cache.adapters import transformers as fht
    from transformers import Qwen3Config

    import fa4cache

    fht.register()
    # "null": attention that costs nothing (the output is the query). A step with it is the
    # rest of the model alone: no attention implementation can beat flex by more than
    # flex's step time over this one (the Amdahl bound of the speedup targets).
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register("null", lambda module, q, k, v, mask, **kw: (q.transpose(1, 2), None))
    AttentionMaskInterface.register("null", fht.padding_mask)
    fa4cache.install()
    return Qwen3Config(
        vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=1 << 17,
    )  # fmt: skip


def batch(T: int, vocab_size: int, doc_range: list[int]) -> tuple[list[int], Any, Any]:
    """One packed row of T tokens: document lengths, input ids, position ids restarting per document."""
    import torch

    rng = random.Random(T)
    lens = doc_lengths(T, rng, *doc_range)
    ids = torch.randint(0, vocab_size, (1, T), device="cuda")
    pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1).cuda()
    return lens, ids, pos


def measure(
    impl: str,
    cfg: Any,
    T: int,
    lens: list[int],
    ids: Any,
    pos: Any,
    a: Any,
    tag: str,
    results: dict[str, Any],
) -> int | None:
    """The median training step of ``impl`` (and with --profile its attention-at-peak bound)
    into ``results``; a failure is recorded there. Returns the model's parameter count,
    None if the model was not built."""
    import torch
    from transformers import AutoModelForCausalLM

    model = None
    params = None
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.bfloat16).cuda()
        model.train()
        step_fn = torch.compile(model) if a.compile else model
        params = sum(x.numel() for x in model.parameters())
        times = []
        for step in range(2 + a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step_fn(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
            loss.backward()
            torch.cuda.synchronize()
            if step >= 2:
                times.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        t = sorted(times)[len(times) // 2]
        results[impl] = {"seconds": t, "tokens_per_s": T / t, "loss": float(loss)}
        if a.profile:
            attn_ms = profile_step(step_fn, ids, pos, tag)
            if impl == "fa4cache" and attn_ms:
                # The step with this attention replaced by one running at the GPU's
                # peak: no exact attention can make the step shorter.
                ideal = t - attn_ms / 1e3 + attention_flops(lens, cfg) / H200_PEAK_FLOPS
                results["attention at peak (bound)"] = {"seconds": ideal, "tokens_per_s": T / ideal}
    except torch.OutOfMemoryError:
        results[impl] = {"error": "out of memory"}
    except Exception as e:  # reported, not fatal: the other implementations still run
        results[impl] = {"error": f"{type(e).__name__}: {str(e)[:100]}"}
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return params


def record(
    T: int, lens: list[int], results: dict[str, Any], rows: list[list[Any]], data: dict[str, Any]
) -> None:
    others = [r["tokens_per_s"] for k, r in results.items() if k in ANCHORS and "tokens_per_s" in r]
    best = max(others) if others else None
    for impl, r in results.items():
        if "error" in r:
            rows.append([T, len(lens), impl, r["error"], "", ""])
            continue
        ratio = f"{r['tokens_per_s'] / best:.2f}x" if best and impl not in ANCHORS else ""
        rows.append([T, len(lens), impl, f"{r['seconds'] * 1e3:.1f}", f"{r['tokens_per_s']:.0f}", ratio])
    data["runs"].append({"tokens": T, "documents": len(lens), "results": results})


def report(a: Any, docs: str, rows: list[list[Any]], data: dict[str, Any], params: int | None) -> None:
    data["parameters"] = params
    data["compiled"] = a.compile
    data["doc_range"] = a.doc_range
    mode = "torch.compile(model)" if a.compile else "eager"
    save(
        f"transformers{'_compiled' if a.compile else ''}_h200{docs}",
        f"transformers training step, random-init Qwen3-style model ({(params or 0) / 1e9:.2f}B parameters), "
        f"{mode}, documents of {a.doc_range[0]}-{a.doc_range[1]} tokens",
        [
            (
                f"Forward+backward of one packed batch, {mode} (median of timed steps; x: over "
                "the faster of sdpa and flex; null: attention that costs nothing and gives k/v no "
                "gradient; attention at peak (bound): fa4cache's step less its attention ops' GPU "
                "time (profiler) plus the attention's FLOPs at the H200's 989.4 TFLOP/s dense BF16 "
                "peak, the bound for any exact attention)",
                table(
                    [
                        "tokens",
                        "documents",
                        "attn_implementation",
                        "step ms",
                        "tokens/s",
                        "vs best other",
                    ],
                    rows,
                ),
            )
        ],
        data,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--impls", nargs="+", default=["fa4cache", "sdpa", "flex_attention"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (every implementation)")
    p.add_argument(
        "--doc-range", type=int, nargs=2, default=[128, 4096], metavar=("MIN", "MAX"),
        help="document lengths, uniform in [MIN, MAX] (the last one cut to fit)",
    )  # fmt: skip
    p.add_argument(
        "--profile", action="store_true", help="also profile one step per implementation (top CUDA kernels)"
    )
    a = p.parse_args()

    import torch  # noqa: F401  (before fa4cache's transformers adapter, as it always was)

    cfg = load(a.layers)
    docs = "" if a.doc_range == [128, 4096] else f"_docs{a.doc_range[0]}-{a.doc_range[1]}"
    suffix = ("_compiled" if a.compile else "") + docs
    rows: list[list[Any]] = []
    data: dict[str, Any] = {"runs": []}
    params = None
    for T in a.lengths:
        lens, ids, pos = batch(T, cfg.vocab_size, a.doc_range)
        results: dict[str, Any] = {}
        for impl in a.impls:
            built = measure(impl, cfg, T, lens, ids, pos, a, f"{impl}_{T}{suffix}", results)
            params = built if built is not None else params
        record(T, lens, results, rows, data)
        report(a, docs, rows, data, params)  # after every length: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
