"""GQA backward on FA4 varlen: FA4's own (float32 dK/dV accumulators, atomics, two
conversion kernels) against k/v expanded to the query heads plus one sum of the groups
(``adapters/varlen_calls.py``, what ``expands_gqa`` picks). Same packed causal
documents for both; the gradients are compared too.

    python benchmarks/bench_gqa_backward.py [--lengths 16384 65536]
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from common import doc_lengths, interleaved_ms, save, table

# (query heads, KV heads, head dim): the transformers benchmark's model, then group sizes
# of common models (Llama-3-8B 32/8, Qwen2.5-7B 28/4, Qwen2.5-0.5B 14/2 at d=64, Llama-3-70B 64/8).
CONFIGS = [(16, 8, 128), (32, 8, 128), (28, 4, 128), (14, 2, 64), (64, 8, 128)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--doc-range", type=int, nargs=2, default=[128, 4096])
    a = p.parse_args()

    import torch
    from fa4cache.adapters import varlen_calls

    import fa4cache
    from fa4cache.varlen import VarlenCall

    fa4cache.install()
    rows: list[list[Any]] = []
    data: list[dict[str, Any]] = []
    for T in a.lengths:
        lens = doc_lengths(T, random.Random(T), *a.doc_range)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
        calls = (VarlenCall(cu, cu, True, (None, None), max(lens)),)
        for hq, hkv, d in CONFIGS:
            torch.manual_seed(0)
            q = torch.randn(T, hq, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(T, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            dout = torch.randn(T, hq, d, device="cuda", dtype=torch.bfloat16)
            out, lse = varlen_calls.forward(q, k, v, calls, None)

            def bwd(expand: bool, t: tuple[Any, ...] = (q, k, v, out, dout, lse)) -> Any:
                return varlen_calls.backward(*t, calls, None, expand_gqa=expand)

            fa4_g, ours_g = bwd(False), bwd(True)
            diff = max(
                float((a_.float() - b_.float()).norm() / b_.float().norm()) for a_, b_ in zip(ours_g, fa4_g)
            )
            ms = interleaved_ms(
                {
                    "fwd": lambda q=q, k=k, v=v: varlen_calls.forward(q, k, v, calls, None),
                    "fa4": lambda: bwd(False),
                    "expanded": lambda: bwd(True),
                }
            )
            auto = varlen_calls.expands_gqa(q, k, v)
            rows.append([
                T, len(lens), f"{hq}/{hkv}", d, f"{ms['fwd']:.3f}", f"{ms['fa4']:.3f}", f"{ms['expanded']:.3f}",
                f"{ms['fa4'] / ms['expanded']:.2f}x",
                f"{(ms['fwd'] + ms['fa4']) / (ms['fwd'] + ms['expanded']):.2f}x",
                "expanded" if auto else "FA4", f"{diff:.1e}",
            ])  # fmt: skip
            data.append({"T": T, "heads": [hq, hkv], "head_dim": d, "ms": ms, "rel_diff": diff, "auto": auto})
            print(rows[-1], flush=True)
            del q, k, v, dout, out, lse, fa4_g, ours_g
            torch.cuda.empty_cache()
    save(
        "gqa_backward_h200",
        "GQA backward on FA4 varlen: FA4's accumulators against k/v expanded to the query heads",
        [
            (
                "Packed causal documents of "
                f"{a.doc_range[0]}-{a.doc_range[1]} tokens, bf16 (median ms, interleaved timing, "
                "common.interleaved_ms; x: FA4's GQA backward time over the expanded one; "
                "auto: what expands_gqa picks; rel diff: largest of dq/dk/dv, expanded vs FA4)",
                table(
                    ["tokens", "documents", "heads q/kv", "head dim", "fwd ms", "bwd ms, FA4 GQA",
                     "bwd ms, expanded", "bwd speedup", "fwd+bwd speedup", "auto", "rel diff"],
                    rows,
                ),
            )
        ],
        {"rows": data},
    )  # fmt: skip


if __name__ == "__main__":
    main()
