"""Document-mask attention on the GPU: fa4cache masks vs FA4 varlen, a bare mask_mod and flex_attention.

Same data for every method: one packed row of random documents (256-4096 tokens),
16 heads, head dim 128, bf16. Also times the block-sparse metadata build against
flex's ``create_block_mask``. Prints a table and saves it under benchmarks/results/.

    python benchmarks/bench_masks.py [--lengths 16384 65536]
"""

from __future__ import annotations

import argparse
import os
import random
from typing import Any

from common import doc_lengths, save, table


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--no-flex", action="store_true")
    a = p.parse_args()

    import torch
    import triton.testing as tt
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    import fa4cache
    from fa4cache.masks import DocumentMaskBuilder, make_document_mask

    ENV_INTERVAL_MASKING = "FA4CACHE_INTERVAL_MASKING"

    fa4cache.install()
    H, D = a.heads, a.head_dim
    rows: list[list[Any]] = []
    window_rows: list[list[Any]] = []
    aligned_rows: list[list[Any]] = []
    batch_rows: list[list[Any]] = []
    meta_rows: list[list[Any]] = []
    data: dict[str, Any] = {"runs": []}

    def bench(fn: Any) -> float:
        return float(tt.do_bench(fn, warmup=25, rep=200, return_mode="median"))

    for T in a.lengths:
        rng = random.Random(T)
        lens = doc_lengths(T, rng)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
        maxlen = max(lens)
        q, k, v = (
            torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        dout = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
        q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v))
        dout4 = dout.unsqueeze(0)
        # Useful work: causal attention inside each document.
        flops_fwd = sum(4 * n * (n + 1) / 2 * D * H for n in lens)

        mask = make_document_mask(cu, seqlen=T)
        mask64 = make_document_mask(cu, seqlen=T, bwd_sparse_tile=(64, 128))
        win = make_document_mask(cu, seqlen=T, window=a.window)
        # FA4's own per-score mask_mod path for partial tiles (what the mask did before
        # fa4cache declared its row intervals to FA4).
        os.environ[ENV_INTERVAL_MASKING] = "0"
        elementwise = make_document_mask(cu, seqlen=T)
        del os.environ[ENV_INTERVAL_MASKING]
        bare = {"mask_mod": elementwise.mask_mod, "aux_tensors": elementwise.aux_tensors}
        bs = mask.block_sparse_tensors
        data.setdefault("tiles", []).append(
            {
                "tokens": T,
                "fwd_partial": int(bs.mask_block_cnt.sum()),
                "fwd_full": int(bs.full_block_cnt.sum()),
                "varlen_diagonal": sum((n + 127) // 128 for n in lens),
            }
        )

        def first(x: Any) -> Any:
            return x[0] if isinstance(x, tuple) else x

        methods: dict[str, tuple[Any, Any]] = {
            "FA4 varlen (anchor)": (
                lambda: first(
                    flash_attn_varlen_func(
                        q,
                        k,
                        v,
                        cu_seqlens_q=cu,
                        cu_seqlens_k=cu,
                        max_seqlen_q=maxlen,
                        max_seqlen_k=maxlen,
                        causal=True,
                    )
                ),
                dout,
            ),
            "fa4cache document mask": (lambda: first(flash_attn_func(q4, k4, v4, **mask)), dout4),
            "fa4cache document mask, element-wise mask_mod": (
                lambda: first(flash_attn_func(q4, k4, v4, **elementwise)),
                dout4,
            ),
            "fa4cache document mask, bwd blocks 64x128": (
                lambda: first(flash_attn_func(q4, k4, v4, **mask64)),
                dout4,
            ),
            "bare mask_mod (no block sparsity)": (lambda: first(flash_attn_func(q4, k4, v4, **bare)), dout4),
        }
        if not a.no_flex:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            doc = torch.repeat_interleave(
                torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda")
            )

            def doc_causal(b: Any, h: Any, qi: Any, ki: Any) -> Any:
                return (doc[qi] == doc[ki]) & (qi >= ki)

            bm = create_block_mask(doc_causal, 1, 1, T, T, device="cuda")
            flex = torch.compile(flex_attention)
            qt, kt, vt = (t.detach().unsqueeze(0).transpose(1, 2).requires_grad_() for t in (q, k, v))
            doutt = dout.unsqueeze(0).transpose(1, 2)
            methods["flex_attention + BlockMask"] = (lambda: flex(qt, kt, vt, block_mask=bm), doutt)
            meta_rows.append(
                [
                    T,
                    "flex create_block_mask",
                    bench(lambda: create_block_mask(doc_causal, 1, 1, T, T, device="cuda")),
                ]
            )
        meta_rows.append(
            [
                T,
                "fa4cache make_document_mask (eager)",
                bench(lambda: make_document_mask(cu, seqlen=T, validate=False)),
            ]
        )
        builder = DocumentMaskBuilder(T, max_documents=len(lens) + 8)
        builder(cu)
        meta_rows.append([T, "fa4cache DocumentMaskBuilder (CUDA graph)", bench(lambda: builder(cu))])
        built = builder(cu)
        same = all(
            torch.equal(getattr(built.block_sparse_tensors, f), getattr(mask.block_sparse_tensors, f))
            for f in ("mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx")
        )
        data.setdefault("builder_matches_eager", []).append(same)

        # Correctness against the anchor before timing anything.
        ref = methods["FA4 varlen (anchor)"][0]().detach().float()
        res: dict[str, dict[str, float]] = {}
        for name, (fwd, g) in methods.items():
            o = (
                fwd().detach().float().reshape(ref.shape)
                if "flex" not in name
                else fwd().detach().transpose(1, 2).float().reshape(ref.shape)
            )
            err = float((o - ref).norm() / ref.norm())
            t_f = bench(fwd)

            def fb(fwd: Any = fwd, g: Any = g) -> None:
                fwd().backward(g)

            t_fb = bench(fb)
            res[name] = {"fwd_ms": t_f, "fwd_bwd_ms": t_fb, "rel_err_vs_varlen": err}
        anchor = res["FA4 varlen (anchor)"]
        for name, r in res.items():
            rows.append(
                [
                    T,
                    name,
                    r["fwd_ms"],
                    r["fwd_bwd_ms"],
                    f"{100 * anchor['fwd_ms'] / r['fwd_ms']:.0f}%",
                    f"{100 * anchor['fwd_bwd_ms'] / r['fwd_bwd_ms']:.0f}%",
                    flops_fwd * 3.5 / (r["fwd_bwd_ms"] * 1e-3) / 1e12,
                    f"{r['rel_err_vs_varlen']:.1e}",
                ]
            )
        data["runs"].append({"tokens": T, "documents": len(lens), "results": res})

        def versus_anchor(out_rows: list[list[Any]], methods: dict[str, tuple[Any, Any]]) -> None:
            # The first method is the anchor; a failure must not cost the main table.
            try:
                ref = None
                got = {}
                for name, (fwd, g) in methods.items():
                    o = fwd().detach().float().reshape(T, H, D)
                    ref = o if ref is None else ref
                    t_f = bench(fwd)
                    t_fb = bench(lambda fwd=fwd, g=g: fwd().backward(g))
                    got[name] = (t_f, t_fb, float((o - ref).norm() / ref.norm()))
                (af, afb, _), *_ = got.values()
                for name, (t_f, t_fb, err) in got.items():
                    out_rows.append(
                        [
                            T,
                            name,
                            t_f,
                            t_fb,
                            f"{100 * af / t_f:.0f}%",
                            f"{100 * afb / t_fb:.0f}%",
                            f"{err:.1e}",
                        ]
                    )
            except Exception as e:
                out_rows.append([T, f"failed: {type(e).__name__}: {str(e)[:120]}", "", "", "", "", ""])

        def varlen(cu_: Any, maxlen_: int, **kw: Any) -> Any:
            return first(
                flash_attn_varlen_func(
                    q, k, v, cu_seqlens_q=cu_, cu_seqlens_k=cu_, max_seqlen_q=maxlen_,
                    max_seqlen_k=maxlen_, causal=True, **kw,
                )
            )  # fmt: skip

        # Sliding window inside documents: the same mask code, anchored on FA4 varlen's
        # own local attention.
        versus_anchor(
            window_rows,
            {
                f"FA4 varlen, window {a.window} (anchor)": (
                    lambda: varlen(cu, maxlen, window_size=(a.window, 0)),
                    dout,
                ),
                f"fa4cache document mask, window {a.window}": (
                    lambda: first(flash_attn_func(q4, k4, v4, **win)),
                    dout4,
                ),
            },
        )
        # Documents whose lengths are multiples of 128: no tile straddles a boundary, so
        # the mask computes exactly varlen's tiles. The gap left here is FA4's block-sparse
        # path itself; the rest of the gap above is the straddling tiles.
        lens_al = [max(256, n // 128 * 128) for n in lens]
        while sum(lens_al) > T:
            i = max(range(len(lens_al)), key=lens_al.__getitem__)
            lens_al[i] -= min(128, sum(lens_al) - T)
        lens_al[-1] += T - sum(lens_al)
        cu_al = torch.tensor([0, *torch.tensor(lens_al).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
        mask_al = make_document_mask(cu_al, seqlen=T)
        versus_anchor(
            aligned_rows,
            {
                "FA4 varlen (anchor)": (lambda: varlen(cu_al, max(lens_al)), dout),
                "fa4cache document mask": (lambda: first(flash_attn_func(q4, k4, v4, **mask_al)), dout4),
            },
        )
        # Batch 2 through document_ids: both rows hold the same documents as the one-row
        # case; the anchor is FA4 varlen over the 2T tokens. Checks every row's output too.
        try:
            ids2 = torch.repeat_interleave(
                torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda")
            ).expand(2, T)
            mask_b2 = make_document_mask(document_ids=ids2)
            cu2 = torch.cat([cu, cu[1:] + T])
            q2, k2, v2 = (
                torch.randn(2 * T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            dout2 = torch.randn(2 * T, H, D, device="cuda", dtype=torch.bfloat16)
            q2b, k2b, v2b = (t.detach().view(2, T, H, D).requires_grad_() for t in (q2, k2, v2))
            anchor2 = lambda: first(flash_attn_varlen_func(  # noqa: E731
                q2, k2, v2, cu_seqlens_q=cu2, cu_seqlens_k=cu2, max_seqlen_q=maxlen,
                max_seqlen_k=maxlen, causal=True,
            ))  # fmt: skip
            ours2 = lambda: first(flash_attn_func(q2b, k2b, v2b, **mask_b2))  # noqa: E731
            ref2 = anchor2().detach().float().view(2, T, H, D)
            got2 = ours2().detach().float()
            errs = [float((got2[r] - ref2[r]).norm() / ref2[r].norm()) for r in range(2)]
            b_af, b_afb = bench(anchor2), bench(lambda: anchor2().backward(dout2))
            b_f, b_fb = bench(ours2), bench(lambda: ours2().backward(dout2.view(2, T, H, D)))
            batch_rows.append([T, "FA4 varlen, 2 x T tokens (anchor)", b_af, b_afb, "100%", "100%", ""])
            batch_rows.append([
                T, "fa4cache document mask, document_ids [2, T]", b_f, b_fb, f"{100 * b_af / b_f:.0f}%",
                f"{100 * b_afb / b_fb:.0f}%", " / ".join(f"{e:.1e}" for e in errs),
            ])  # fmt: skip
        except Exception as e:
            batch_rows.append([T, f"failed: {type(e).__name__}: {str(e)[:120]}", "", "", "", "", ""])
    flex_rows = {(r[0], r[1]): r for r in rows}
    ratios = []
    for T in a.lengths:
        ours = flex_rows.get((T, "fa4cache document mask"))
        fl = flex_rows.get((T, "flex_attention + BlockMask"))
        if ours and fl:
            ratios.append([T, fl[2] / ours[2], fl[3] / ours[3]])
    sections = [
        (
            "Forward and forward+backward (median ms; % of FA4 varlen throughput)",
            table(
                [
                    "tokens",
                    "method",
                    "fwd ms",
                    "fwd+bwd ms",
                    "fwd vs varlen",
                    "fwd+bwd vs varlen",
                    "fwd+bwd TFLOP/s",
                    "rel err",
                ],
                rows,
            ),
        ),
        (
            f"Sliding window {a.window} inside documents (median ms; % of FA4 varlen local)",
            table(
                ["tokens", "method", "fwd ms", "fwd+bwd ms", "fwd vs varlen", "fwd+bwd vs varlen", "rel err"],
                window_rows,
            ),
        ),
        (
            "Documents aligned to 128 tokens: no tile straddles a boundary (median ms)",
            table(
                ["tokens", "method", "fwd ms", "fwd+bwd ms", "fwd vs varlen", "fwd+bwd vs varlen", "rel err"],
                aligned_rows,
            ),
        ),
        (
            "Batch 2 (document_ids), the same documents in both rows (median ms; rel err per row)",
            table(
                [
                    "tokens/row",
                    "method",
                    "fwd ms",
                    "fwd+bwd ms",
                    "fwd vs varlen",
                    "fwd+bwd vs varlen",
                    "rel err",
                ],
                batch_rows,
            ),
        ),
        ("Block-sparse metadata build (median ms)", table(["tokens", "builder", "ms"], meta_rows)),
        (
            "Forward tiles (128x128) computed",
            table(
                ["tokens", "masked (partial) tiles", "full tiles", "varlen diagonal tiles"],
                [[t["tokens"], t["fwd_partial"], t["fwd_full"], t["varlen_diagonal"]] for t in data["tiles"]],
            ),
        ),
    ]
    if ratios:
        sections.append(("Speed-up over flex_attention (x)", table(["tokens", "fwd", "fwd+bwd"], ratios)))
    data["metadata"] = meta_rows
    save("masks_h200", "Document-mask attention on the GPU", sections, data)


if __name__ == "__main__":
    main()
