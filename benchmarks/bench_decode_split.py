"""Probe (H200): a decode step's attention on the GPU alone, inside CUDA graphs (what the
static compiled path replays), FA4 as fa4cache calls it today against the keys split into
S chunks (each chunk a varlen sequence of its own, FA4's LSE returned) and combined by
FA4's own combine kernel; and sdpa. GPU µs per call, median of 5 graph replays.

    python benchmarks/bench_decode_split.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any


def gpu_us(fn: Any, reps: int = 5, inner: int = 50) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(inner):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / inner)
    return statistics.median(times)


import triton
import triton.language as tl


@triton.jit
def _combine(
    o_p, lse_p, out, rows, G, S: tl.constexpr, OUTER: tl.constexpr, D: tl.constexpr, BS: tl.constexpr
):
    r = tl.program_id(0)
    s = tl.arange(0, BS)
    d = tl.arange(0, D)
    if OUTER:
        at = s * rows + r
    else:
        at = (r // G) * S * G + s * G + r % G
    lse = tl.load(lse_p + at, mask=s < S, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m)
    tot = tl.sum(w, 0)
    o = tl.load(o_p + at[:, None] * D + d[None, :], mask=(s < S)[:, None], other=0.0).to(tl.float32)
    acc = tl.sum(o * w[:, None], 0) / tl.where(tot == 0.0, 1.0, tot)
    tl.store(out + r * D + d, acc.to(out.dtype.element_ty))


def split_decode(
    query: Any,
    key: Any,
    value: Any,
    cu: Any,
    used: Any,
    S: int,
    C: int,
    scale: float,
    outer: bool = True,
    how: str = "fa4",
) -> Any:
    import torch
    from flash_attn.cute import interface as fi

    B, Hq, _, D = query.shape
    Hkv, Tk, Dv = key.shape[1], key.shape[2], value.shape[-1]
    g, n = Hq // Hkv, B * Hkv
    k = key.reshape(n * Tk, 1, D)
    v = value.reshape(n * Tk, 1, Dv)
    if outer:
        q = query.view(n, 1, g, D).expand(S, n, 1, g, D).reshape(S * n, 1, g, D)
        j = torch.arange(S, device=q.device, dtype=torch.int32).view(S, 1) * C
        cu_s = torch.cat(((cu[:-1].view(1, n) + j).reshape(-1), cu[-1:]))
        used_s = (used.view(1, n) - j).clamp(0, C).reshape(-1).to(torch.int32)
    else:
        q = query.view(n, 1, 1, g, D).expand(n, S, 1, g, D).reshape(n * S, 1, g, D)
        j = torch.arange(S, device=q.device, dtype=torch.int32).view(1, S) * C
        cu_s = torch.cat(((cu[:-1].view(n, 1) + j).reshape(-1), cu[-1:]))
        used_s = (used.view(n, 1) - j).clamp(0, C).reshape(-1).to(torch.int32)
    out_p = query.new_empty(S * n, 1, g, Dv)
    lse_p = torch.empty(S * n, g, 1, dtype=torch.float32, device=q.device)
    fi._flash_attn_fwd(
        q,
        k,
        v,
        cu_seqlens_k=cu_s,
        seqused_k=used_s,
        max_seqlen_k=C,
        softmax_scale=scale,
        causal=True,
        out=out_p,
        lse=lse_p,
        return_lse=True,
    )
    result = query.new_empty(B, 1, Hq, Dv)
    if how == "torch":
        if outer:
            o, l = out_p.view(S, n, g, Dv).float(), lse_p.view(S, n, g)
        else:
            o, l = out_p.view(n, S, g, Dv).transpose(0, 1).float(), lse_p.view(n, S, g).transpose(0, 1)
        m = l.amax(0).nan_to_num(0.0, neginf=0.0)
        w = torch.exp(l - m)
        res = (o * w[..., None]).sum(0) / w.sum(0).clamp(min=1e-30)[..., None]
        result.view(n, g, Dv).copy_(res)
    elif how == "triton":
        _combine[(n * g,)](
            out_p, lse_p, result, n * g, g, S=S, OUTER=outer, D=Dv, BS=triton.next_power_of_2(S)
        )
    else:
        assert outer
        fi._flash_attn_fwd_combine(
            out_p.view(S, n, 1, g, Dv), lse_p.view(S, n, g, 1).transpose(2, 3), result.view(n, 1, g, Dv)
        )
    return result


def case(name: str) -> None:
    """One correctness case in its own process (an illegal address poisons the context)."""
    import torch
    from fa4cache.ops import kv_cache

    outer = "outer" in name
    how = name.split("_")[0]
    for B, Tk, D in ((1, 2048, 64), (8, 2048, 128), (3, 1000, 64)):
        q = torch.randn(B, 16, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, 4, Tk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, 4, Tk, D, device="cuda", dtype=torch.bfloat16)
        mask = torch.ones(B, Tk, device="cuda", dtype=torch.long)
        mask[:, : Tk // 8] = 0
        ref = kv_cache.forward(q, k, v, mask, None, True, None, D**-0.5, 0.0)
        cu, used = kv_cache._sequences(mask, None, B, 4, Tk)
        for S in (2, 4, 8, 16):
            C = -(-(-(-Tk // S)) // 128) * 128
            if (S - 1) * C >= Tk:
                continue
            out = split_decode(q, k, v, cu, used, S, C, D**-0.5, outer, how)
            torch.cuda.synchronize()
            print(name, B, Tk, D, S, "maxerr", (out.float() - ref.float()).abs().max().item(), flush=True)


def main() -> None:
    import subprocess

    if len(sys.argv) > 2 and sys.argv[1] == "case":
        return case(sys.argv[2])
    ok = {}
    for name in ("torch_outer", "torch_inner", "triton_outer", "triton_inner", "fa4_outer"):
        env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
        p = subprocess.run(
            [sys.executable, __file__, "case", name], env=env, capture_output=True, text=True, timeout=150
        )
        lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "maxerr" in ln or "Error" in ln]
        print(name, "rc", p.returncode, *lines[-14:], sep="\n  ", flush=True)
        ok[name] = p.returncode == 0
    timing(ok)


def timing(ok: dict[str, bool]) -> None:
    import torch
    from fa4cache.ops import kv_cache

    torch.manual_seed(0)
    rows = []
    for Hq, Hkv, D in ((16, 4, 64), (32, 8, 128)):
        for B in (1, 8, 32):
            for Tk in (2048, 4096):
                q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(B, Hkv, Tk, D, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(B, Hkv, Tk, D, device="cuda", dtype=torch.bfloat16)
                mask = torch.ones(B, Tk, device="cuda", dtype=torch.long)
                mask[:, : Tk // 8] = 0  # left padding / unused: 7/8 of the buffer used
                scale = D**-0.5
                ref = kv_cache.forward(q, k, v, mask, None, True, None, scale, 0.0)
                n = B * Hkv
                cu, used = kv_cache._sequences(mask, None, B, Hkv, Tk)
                row: dict[str, Any] = {"Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "Tk": Tk}
                row["fa4cache"] = round(
                    gpu_us(lambda: kv_cache.forward(q, k, v, mask, None, True, None, scale, 0.0)), 2
                )
                am = mask.bool()[:, None, None, :]
                row["sdpa_gqa_mask"] = round(
                    gpu_us(
                        lambda: torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, attn_mask=am, scale=scale, enable_gqa=True
                        )
                    ),
                    2,
                )
                row["sdpa_gqa_nomask"] = round(
                    gpu_us(
                        lambda: torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, scale=scale, enable_gqa=True
                        )
                    ),
                    2,
                )
                for how, outer in (("fa4", True), ("triton", True), ("triton", False)):
                    if not ok.get(f"{how}_{'outer' if outer else 'inner'}"):
                        continue
                    for S in (2, 4, 8, 16, 32):
                        C = -(-Tk // S)
                        C = -(-C // 128) * 128
                        if (S - 1) * C >= Tk or (how == "fa4" and S > 16):
                            continue
                        tag = f"{how}{'O' if outer else 'I'}{S}"
                        out = split_decode(q, k, v, cu, used, S, C, scale, outer, how)
                        row[tag + "_err"] = round((out.float() - ref.float()).abs().max().item(), 5)
                        row[tag] = round(
                            gpu_us(lambda: split_decode(q, k, v, cu, used, S, C, scale, outer, how)), 2
                        )
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = os.environ.get("FA4CACHE_RESULTS", ".")
    with open(os.path.join(out, "decode_split_probe_h200.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
