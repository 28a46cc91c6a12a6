"""fa4cache.attention (per-document tiling on FA4 varlen) against FA4 varlen, the dense path and flex.

Same data for every method in a row: packed rows of random documents (512-8192 tokens),
bf16, d=128. Plain document-causal and -bidirectional through ``fa4cache.attention`` at
16K/64K/128K tokens per row, B=1 and B=2, MHA (16/16) and GQA (32/8), with and without a
host ``max_seqlen``; then prefix-LM, sliding window and draft-block masks in useful
TFLOP/s against FA4 varlen causal's in the same run, against today's dense path and flex.

    python benchmarks/bench_varlen.py [--lengths 16384 65536 131072]
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from common import causal_pairs, doc_lengths, interleaved_ms, save, table


def other_documents(T: int) -> list[int]:
    """The documents of the prefix-LM / window / draft section (seeded: the same every run)."""
    return doc_lengths(T, random.Random(T + 5), 512, 8192)


def tile_pairs(lens: list[int], window: int | None, tile_m: int, tile_n: int) -> int:
    """(query, key) pairs in the tiles a varlen causal/window kernel computes for documents
    of ``lens`` tokens: every (tile_m x tile_n) tile of each document that holds a visible pair."""
    total = 0
    for n in lens:
        for r0 in range(0, n, tile_m):
            r1 = min(n, r0 + tile_m) - 1
            lo = 0 if window is None else max(0, r0 - window)
            total += (r1 // tile_n - lo // tile_n + 1) * tile_m * tile_n
    return total


# FA4 4.0.0b36's sm90 tiles at d=128 for causal and local masks: forward 128x128,
# backward 64 query rows by 128 keys.
FWD_TILE, BWD_TILE = (128, 128), (64, 128)
WINDOWS = (512, 1024, 2048, 4096)


def tile_ceiling(lens: list[int], window: int, tile: tuple[int, int]) -> float:
    """The most useful TFLOP/s a window can reach relative to causal on these documents
    if every computed tile ran at causal's speed: the two masks' shares of useful pairs
    among the pairs their tiles compute."""
    useful = causal_pairs(lens, window) / tile_pairs(lens, window, *tile)
    return useful / (causal_pairs(lens) / tile_pairs(lens, None, *tile))


def ceiling_rows(T: int, lens: list[int]) -> list[list[Any]]:
    return [
        [T, f"window {w}", causal_pairs(lens, w) / sum(lens),
         f"{100 * tile_ceiling(lens, w, FWD_TILE):.0f}%", f"{100 * tile_ceiling(lens, w, BWD_TILE):.0f}%"]
        for w in WINDOWS
    ]  # fmt: skip


CEILING_HEADING = (
    "Tile ceiling of FA4's sliding window against causal, computed (no GPU): useful pairs over "
    "the pairs the kernel's tiles compute, window over causal, same documents (forward tiles "
    f"{FWD_TILE}, backward {BWD_TILE})"
)
CEILING_COLUMNS = ["tokens", "FA4 varlen", "keys per query", "fwd ceiling vs causal", "bwd ceiling vs causal"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536, 131072])
    p.add_argument("--other-lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--no-flex", action="store_true")
    p.add_argument(
        "--tile-ceiling", action="store_true", help="only the window tile-ceiling table (CPU, no GPU)"
    )
    a = p.parse_args()
    if a.tile_ceiling:
        rows = [r for T in a.other_lengths for r in ceiling_rows(T, other_documents(T))]
        save(
            "varlen_window_tile_ceiling",
            "FA4 sliding window: tile ceiling against causal (computed)",
            [(CEILING_HEADING, table(CEILING_COLUMNS, rows))],
            {"rows": rows},
        )
        return

    import torch
    import triton.testing as tt
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    import fa4cache
    from fa4cache.masks import DocumentMaskBuilder, make_document_mask, make_draft_block_mask

    fa4cache.install()
    D = 128

    def bench(fn: Any) -> float:
        return float(tt.do_bench(fn, warmup=25, rep=150, return_mode="median"))

    def first(x: Any) -> Any:
        return x[0] if isinstance(x, tuple) else x

    def fwd_bwd(fns: dict[str, tuple[Any, Any]]) -> dict[str, tuple[float, float]]:
        """Forward and forward+backward ms of each (fwd, dout), interleaved (common.interleaved_ms)."""
        f = interleaved_ms({n: fn for n, (fn, _) in fns.items()})
        fb = interleaved_ms({n: (lambda fn=fn, d=d: fn().backward(d)) for n, (fn, d) in fns.items()})
        return {n: (f[n], fb[n]) for n in fns}

    def anatomy(
        T: int, q: Any, k: Any, v: Any, dout: Any, cu: Any, maxlen: int, lens: list[int], flops: Any
    ) -> list[list[Any]]:
        """Forward and backward apart, for FA4 varlen causal and FA4's own sliding window
        (the kernel fa4cache.attention calls for window masks) at several widths: where a
        window's useful TFLOP/s go, and how they grow with the keys each query sees."""
        cases = {"causal": ({"causal": True}, causal_pairs(lens))}
        for w in WINDOWS:
            cases[f"window {w}"] = ({"causal": True, "window_size": (w, 0)}, causal_pairs(lens, w))
        fns = {
            name: (
                lambda kw=kw: first(flash_attn_varlen_func(
                    q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=maxlen, max_seqlen_k=maxlen, **kw
                )),
                dout,
            )
            for name, (kw, _) in cases.items()
        }  # fmt: skip
        t = fwd_bwd(fns)
        # (forward, backward) useful TFLOP/s: the backward is 2.5 of the 3.5 forward units.
        tf = {
            name: (
                flops(pairs) / 3.5 / (t[name][0] * 1e-3) / 1e12,
                flops(pairs) * 2.5 / 3.5 / ((t[name][1] - t[name][0]) * 1e-3) / 1e12,
            )
            for name, (_, pairs) in cases.items()
        }
        return [
            [T, name, pairs / sum(lens), t[name][0], tf[name][0], f"{100 * tf[name][0] / tf['causal'][0]:.0f}%",
             t[name][1] - t[name][0], tf[name][1], f"{100 * tf[name][1] / tf['causal'][1]:.0f}%"]
            for name, (_, pairs) in cases.items()
        ]  # fmt: skip

    plain_rows: list[list[Any]] = []
    anatomy_rows: list[list[Any]] = []
    ceiling: list[list[Any]] = []
    other_rows: list[list[Any]] = []
    meta_rows: list[list[Any]] = []
    data: dict[str, Any] = {"plain": [], "other": []}

    # ------------------------------------------------------------ plain document masks
    for T in a.lengths:
        for B in (1, 2):
            rng = random.Random(T * 10 + B)
            rows = [doc_lengths(T, rng, 512, 8192) for _ in range(B)]
            lens = [n for r in rows for n in r]
            maxlen = max(lens)
            cu_all = torch.tensor(
                [0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32
            )
            ids = torch.stack(
                [torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in rows]
            ).cuda()
            for Hq, Hkv in ((16, 16), (32, 8)):
                q = torch.randn(B * T, Hq, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k, v = (
                    torch.randn(B * T, Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2)
                )
                dout = torch.randn(B * T, Hq, D, device="cuda", dtype=torch.bfloat16)
                q4, k4, v4 = (t.detach().view(B, T, *t.shape[1:]).requires_grad_() for t in (q, k, v))
                dout4 = dout.view(B, T, Hq, D)
                for causal in (True, False):
                    anchor = lambda c=causal: first(flash_attn_varlen_func(  # noqa: E731
                        q, k, v, cu_seqlens_q=cu_all, cu_seqlens_k=cu_all, max_seqlen_q=maxlen,
                        max_seqlen_k=maxlen, causal=c,
                    ))  # fmt: skip
                    kw: dict[str, Any] = {"causal": causal, "block_sparse": False}
                    with_max = make_document_mask(document_ids=ids, max_seqlen=maxlen, **kw)
                    without = make_document_mask(document_ids=ids, **kw)
                    ours_max = lambda m=with_max: fa4cache.attention(q4, k4, v4, m)  # noqa: E731
                    ours = lambda m=without: fa4cache.attention(q4, k4, v4, m)  # noqa: E731
                    ref = anchor().detach().float()
                    err = float((ours().detach().float().reshape(ref.shape) - ref).norm() / ref.norm())
                    t = fwd_bwd({"anchor": (anchor, dout), "max": (ours_max, dout4), "none": (ours, dout4)})
                    (af, afb), (mf, mfb), (nf, nfb) = t["anchor"], t["max"], t["none"]
                    name = "causal" if causal else "bidirectional"
                    plain_rows.append([
                        T, B, f"{Hq}/{Hkv}", name, af, afb,
                        f"{100 * af / mf:.0f}%", f"{100 * afb / mfb:.0f}%",
                        f"{100 * af / nf:.0f}%", f"{100 * afb / nfb:.0f}%", f"{err:.1e}",
                    ])  # fmt: skip
                    data["plain"].append(
                        {"T": T, "B": B, "heads": [Hq, Hkv], "mask": name, "varlen": [af, afb],
                         "with_max_seqlen": [mf, mfb], "without": [nf, nfb], "rel_err": err}
                    )  # fmt: skip
                del q, k, v, q4, k4, v4, dout
                torch.cuda.empty_cache()

    # ------------------------------------------------------------ prefix-LM, window, draft
    H = 16
    for T in a.other_lengths:
        lens = other_documents(T)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
        maxlen = max(lens)
        q, k, v = (
            torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        dout = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
        q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v))
        dout4 = dout.unsqueeze(0)

        def flops(pairs: float) -> float:  # forward+backward FLOPs of `pairs` visible (q, k) pairs
            return 4 * D * H * pairs * 3.5

        anchor_pairs = causal_pairs(lens)
        anchor = lambda: first(flash_attn_varlen_func(  # noqa: E731
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=maxlen, max_seqlen_k=maxlen, causal=True
        ))  # fmt: skip
        anchor_ms: list[float] = []
        prefix = torch.tensor([rng.randint(0, n // 2) for n in lens], device="cuda")
        window = 1024
        ctx = T // 2
        K = (T - ctx) // 16
        anchors = torch.tensor([sorted(rng.randrange(ctx) for _ in range(K))], device="cuda")
        cases = {
            "prefix-LM": (
                make_document_mask(cu, seqlen=T, prefix_lengths=prefix, max_seqlen=maxlen),
                sum(
                    min(p, n) ** 2 + (n * (n + 1) - min(p, n) * (min(p, n) + 1)) / 2
                    for p, n in zip(prefix.tolist(), lens)
                ),
            ),
            f"window {window}": (
                make_document_mask(cu, seqlen=T, window=window, max_seqlen=maxlen),
                causal_pairs(lens, window),
            ),
            "draft-block 16": (
                make_draft_block_mask(anchors, context_len=ctx, draft_block_size=16),
                ctx * (ctx + 1) / 2 + sum((x + 1 + 16) * 16 for x in anchors[0].tolist()),
            ),
        }
        group_rows = []
        for name, (mask, pairs) in cases.items():
            tq, tk, tv, td = (q4, k4, v4, dout4)
            if mask.seqlen != T:  # the draft mask's own length
                tq, tk, tv = (
                    torch.randn(1, mask.seqlen, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3)
                )
                td = torch.randn(1, mask.seqlen, H, D, device="cuda", dtype=torch.bfloat16)
            paths = {
                "fa4cache.attention": lambda m=mask, a_=(tq, tk, tv): fa4cache.attention(*a_, m),
                "dense block-sparse path": lambda m=mask, a_=(tq, tk, tv): first(flash_attn_func(*a_, **m)),
            }
            if not a.no_flex:
                from torch.nn.attention.flex_attention import create_block_mask, flex_attention

                flex = torch.compile(flex_attention)
                # What a flex user writes: the mask from per-row tensors (here the mask's own
                # key intervals), not a dense [T, T] lookup, which is slow and, past 2^31
                # elements, indexes wrongly.
                lo, hi = (x[0].contiguous() for x in mask.intervals)

                def mod(b: Any, h: Any, qi: Any, ki: Any, lo: Any = lo, hi: Any = hi) -> Any:
                    keep = (ki >= lo[0, qi]) & (ki < hi[0, qi])
                    for j in range(1, lo.shape[0]):
                        keep = keep | ((ki >= lo[j, qi]) & (ki < hi[j, qi]))
                    return keep

                bm = create_block_mask(mod, 1, 1, mask.seqlen, mask.seqlen, device="cuda")
                qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (tq, tk, tv))
                paths["flex_attention"] = lambda bm=bm, a_=(qt, kt, vt): flex(*a_, block_mask=bm).transpose(
                    1, 2
                )
            ref = paths["fa4cache.attention"]().detach().float()
            errs = {
                path: float((fn().detach().float() - ref).norm() / ref.norm()) for path, fn in paths.items()
            }
            # Against a float32 reference too: agreement between methods alone would hide a
            # shared error.
            ours_err = float("nan")
            if mask.seqlen <= 16384:  # per head, [T, T] in float32
                dense = mask.dense()[0]
                num = den = 0.0
                for h in range(H):
                    s_ = (tq[0, :, h].float() @ tk[0, :, h].float().t()) / D**0.5
                    p_ = s_.masked_fill_(~dense, float("-inf")).softmax(-1)
                    exact = p_ @ tv[0, :, h].float()
                    num += float((ref[0, :, h] - exact).norm() ** 2)
                    den += float(exact.norm() ** 2)
                    del s_, p_, exact
                ours_err = (num / den) ** 0.5
                del dense
            t = interleaved_ms(
                {"anchor": lambda: anchor().backward(dout)}
                | {path: (lambda fn=fn, d=td: fn().backward(d)) for path, fn in paths.items()}
            )
            anchor_ms.append(t["anchor"])
            anchor_tflops = flops(anchor_pairs) / (t["anchor"] * 1e-3) / 1e12
            for path in paths:
                tf = flops(pairs) / (t[path] * 1e-3) / 1e12
                group_rows.append([
                    T, f"{name}: {path}", "varlen" if (path == "fa4cache.attention" and mask.varlen is not None) else "dense",
                    t[path], tf, f"{100 * tf / anchor_tflops:.0f}%", f"{t[path] / t['fa4cache.attention']:.2f}x",
                    f"{errs[path]:.1e}", f"{ours_err:.1e}" if path == "fa4cache.attention" else "",
                ])  # fmt: skip
            data["other"].append(
                {"T": T, "mask": name, "fwd_bwd_ms": {k_: t[k_] for k_ in t}, "rel_err_vs_ours": errs,
                 "ours_rel_err_vs_fp32": ours_err}
            )  # fmt: skip
        anatomy_rows.extend(anatomy(T, q, k, v, dout, cu, maxlen, lens, flops))
        ceiling.extend(ceiling_rows(T, lens))
        a_ms = sorted(anchor_ms)[len(anchor_ms) // 2]
        other_rows.append(
            [T, "FA4 varlen causal (anchor, median of the groups)", "-", a_ms,
             flops(anchor_pairs) / (a_ms * 1e-3) / 1e12, "100%", "", "", ""]
        )  # fmt: skip
        other_rows.extend(group_rows)
        builder = DocumentMaskBuilder(T, max_documents=len(lens) + 8, block_sparse=False)
        builder(cu)
        meta_rows.append([T, "DocumentMaskBuilder (varlen layout only)", bench(lambda: builder(cu))])
        builder_bs = DocumentMaskBuilder(T, max_documents=len(lens) + 8)
        builder_bs(cu)
        meta_rows.append(
            [T, "DocumentMaskBuilder (with block-sparse metadata)", bench(lambda: builder_bs(cu))]
        )

    sections = [
        (
            "Plain document masks through fa4cache.attention (% of FA4 varlen throughput; "
            "anchor median ms; interleaved timing, common.interleaved_ms)",
            table(
                ["tokens/row", "B", "heads q/kv", "mask", "varlen fwd ms", "varlen fwd+bwd ms",
                 "fwd, max_seqlen given", "fwd+bwd, max_seqlen given", "fwd, no max_seqlen",
                 "fwd+bwd, no max_seqlen", "rel err"],
                plain_rows,
            ),
        ),
        (
            "Other masks, forward+backward: useful TFLOP/s vs FA4 varlen causal in the same run "
            "(x: time relative to fa4cache.attention; interleaved timing, common.interleaved_ms)",
            table(["tokens", "mask: method", "path", "fwd+bwd ms", "useful TFLOP/s", "vs varlen causal",
                   "time vs ours", "rel err vs ours", "ours: rel err vs fp32"], other_rows),
        ),
        (
            "FA4 varlen causal and FA4's sliding window, forward and backward apart (same documents; "
            "backward = forward+backward minus forward; useful TFLOP/s; % of causal's in the same direction)",
            table(["tokens", "FA4 varlen", "keys per query", "fwd ms", "fwd TFLOP/s", "fwd vs causal",
                   "bwd ms", "bwd TFLOP/s", "bwd vs causal"], anatomy_rows),
        ),
        (CEILING_HEADING, table(CEILING_COLUMNS, ceiling)),
        ("Metadata (median ms)", table(["tokens", "builder", "ms"], meta_rows)),
    ]  # fmt: skip
    save("varlen_h200", "fa4cache.attention: per-document tiling on FA4 varlen", sections, data)


if __name__ == "__main__":
    main()
