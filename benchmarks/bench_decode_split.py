"""A decode step's attention on the GPU alone, inside CUDA graphs (what the compiled path
replays): fa4cache's KV-cache call with split decoding (:mod:`fa4cache.decode.split_kv`,
the default of the compiled path) and without (``FA4CACHE_DECODE_SPLIT=0``: one FA4 call
over each sequence's whole cache), against sdpa with transformers' static-cache mask and
without a mask. GPU µs per call: a graph of 50 calls replayed, the median of 5 replays,
the implementations measured in alternating order.

    python benchmarks/bench_decode_split.py

Writes decode_split_h200.{md,json} under $FA4CACHE_RESULTS (or benchmarks/results).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from common import save, table


def gpu_us(fn: Any, reps: int = 5, inner: int = 50) -> float:
    import torch

    for _ in range(3):
        fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=side):
            for _ in range(inner):
                fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / inner)
    return statistics.median(times)


def main() -> None:
    import torch
    import torch.nn.functional as F

    from fa4cache.decode import choose, kv_cache
    from fa4cache.settings import reread_decode_switches

    torch.manual_seed(0)

    def ours(split: bool, *args: Any) -> Any:
        os.environ["FA4CACHE_DECODE_SPLIT"] = "1" if split else "0"
        reread_decode_switches()  # read once a process otherwise
        return kv_cache.forward(*args)

    rows, data = [], []
    for Hq, Hkv, D in ((16, 4, 64), (32, 8, 128)):
        for B in (1, 8, 32):
            for Tk in (1024, 2048, 4096, 8192):
                q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(B, Hkv, Tk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                mask = torch.ones(B, Tk, dtype=torch.long, device="cuda")
                mask[:, : Tk // 8] = 0  # 7/8 of each row's slots hold its tokens
                args = (q, k, v, mask, None, True, None, D**-0.5, 0.0)
                am = mask.bool()[:, None, None, :]
                fns = {
                    "split": lambda: ours(True, *args),
                    "unsplit": lambda: ours(False, *args),
                    "sdpa_mask": lambda: F.scaled_dot_product_attention(
                        q, k, v, attn_mask=am, enable_gqa=True
                    ),
                    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                }
                err = float((ours(True, *args).float() - ours(False, *args).float()).abs().max())
                runs: dict[str, list[float]] = {n: [] for n in fns}
                for r in range(3):
                    for name in list(fns)[:: 1 if r % 2 == 0 else -1]:
                        runs[name].append(gpu_us(fns[name]))
                us = {n: statistics.median(t) for n, t in runs.items()}
                os.environ["FA4CACHE_DECODE_SPLIT"] = "1"
                reread_decode_switches()
                plan = choose.split_plan(B * Hkv, Tk, D)
                row = {
                    "heads": f"{Hq}:{Hkv}",
                    "D": D,
                    "B": B,
                    "Tk": Tk,
                    "plan": plan,
                    "us": us,
                    "max_err": err,
                }
                data.append(row)
                rows.append([
                    f"{Hq}:{Hkv}", D, B, Tk, "-" if plan is None else f"{plan[0]} x {plan[1]}",
                    us["unsplit"], us["split"], us["sdpa_mask"], us["sdpa"],
                    f"{us['unsplit'] / us['split']:.2f}x", f"{us['sdpa_mask'] / us['split']:.2f}x", f"{err:.4f}",
                ])  # fmt: skip
                print(row, flush=True)
    os.environ.pop("FA4CACHE_DECODE_SPLIT", None)
    reread_decode_switches()
    headers = [
        "Hq:Hkv", "D", "B", "Tk", "split (S x keys)", "fa4cache unsplit µs", "fa4cache split µs", "sdpa, mask µs",
        "sdpa, no mask µs", "unsplit / split", "sdpa mask / split", "max |split - unsplit|",
    ]  # fmt: skip
    save(
        "decode_split_h200",
        "A decode call's attention inside CUDA graphs: split decoding on FA4 (GPU µs per call, median of 3 "
        "alternating rounds of 5 replays of 50 calls)",
        [
            ("Command", "`python benchmarks/bench_decode_split.py`"),
            (
                "GPU µs per decode call (query [B, Hq, 1, D], cache [B, Hkv, Tk, D] bf16, 7/8 of each row used)",
                table(headers, rows),
            ),
        ],  # fmt: skip
        {"rows": data},
    )


if __name__ == "__main__":
    main()
