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
from dataclasses import dataclass, field
from typing import Any

from common import (
    PackedRow,
    bench_ms,
    cu_seqlens,
    doc_lengths,
    document_ids,
    first,
    install_fa4cache,
    packed_row,
    rel_err,
    save,
    table,
)

ENV_INTERVAL_MASKING = "FA4CACHE_INTERVAL_MASKING"
# name -> (forward, gradient of its output)
Methods = dict[str, tuple[Any, Any]]


@dataclass(frozen=True)
class Length:
    """One length's shared setup: the documents and data, and the masks built on them."""

    row: PackedRow
    window: int
    mask: Any
    mask64: Any  # backward blocks 64x128
    win: Any  # sliding window inside documents
    elementwise: Any  # FA4's per-score mask_mod path for partial tiles


@dataclass
class Rows:
    """The tables' rows over every length, and the JSON data."""

    main: list[list[Any]] = field(default_factory=list)
    window: list[list[Any]] = field(default_factory=list)
    aligned: list[list[Any]] = field(default_factory=list)
    batch: list[list[Any]] = field(default_factory=list)
    meta: list[list[Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=lambda: {"runs": []})


def setup(T: int, heads: int, head_dim: int, window: int) -> Length:
    from fa4cache.masks import make_document_mask

    rng = random.Random(T)
    lens = doc_lengths(T, rng)
    row = packed_row(T, lens, heads, head_dim)
    cu = row.cu
    mask = make_document_mask(cu, seqlen=T)
    mask64 = make_document_mask(cu, seqlen=T, bwd_sparse_tile=(64, 128))
    win = make_document_mask(cu, seqlen=T, window=window)
    # FA4's own per-score mask_mod path for partial tiles (what the mask did before
    # fa4cache declared its row intervals to FA4).
    os.environ[ENV_INTERVAL_MASKING] = "0"
    elementwise = make_document_mask(cu, seqlen=T)
    del os.environ[ENV_INTERVAL_MASKING]
    return Length(row, window, mask, mask64, win, elementwise)


def record_tiles(s: Length, out: Rows) -> None:
    bs = s.mask.block_sparse_tensors
    out.data.setdefault("tiles", []).append(
        {
            "tokens": s.row.T,
            "fwd_partial": int(bs.mask_block_cnt.sum()),
            "fwd_full": int(bs.full_block_cnt.sum()),
            "varlen_diagonal": sum((n + 127) // 128 for n in s.row.lens),
        }
    )


def main_methods(s: Length) -> Methods:
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    r = s.row
    q, k, v, q4, k4, v4, cu, maxlen = r.q, r.k, r.v, r.q4, r.k4, r.v4, r.cu, r.maxlen
    mask, mask64, elementwise = s.mask, s.mask64, s.elementwise
    bare = {"mask_mod": elementwise.mask_mod, "aux_tensors": elementwise.aux_tensors}
    return {
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
            r.dout,
        ),
        "fa4cache document mask": (lambda: first(flash_attn_func(q4, k4, v4, **mask)), r.dout4),
        "fa4cache document mask, element-wise mask_mod": (
            lambda: first(flash_attn_func(q4, k4, v4, **elementwise)),
            r.dout4,
        ),
        "fa4cache document mask, bwd blocks 64x128": (
            lambda: first(flash_attn_func(q4, k4, v4, **mask64)),
            r.dout4,
        ),
        "bare mask_mod (no block sparsity)": (lambda: first(flash_attn_func(q4, k4, v4, **bare)), r.dout4),
    }


def flex_method(s: Length) -> tuple[tuple[Any, Any], Any]:
    """flex_attention with a BlockMask of the same documents: the method, and its mask_mod."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    r = s.row
    doc = document_ids(r.lens)

    def doc_causal(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return (doc[qi] == doc[ki]) & (qi >= ki)

    bm = create_block_mask(doc_causal, 1, 1, r.T, r.T, device="cuda")
    flex = torch.compile(flex_attention)
    qt, kt, vt = (t.detach().unsqueeze(0).transpose(1, 2).requires_grad_() for t in (r.q, r.k, r.v))
    doutt = r.dout.unsqueeze(0).transpose(1, 2)
    return (lambda: flex(qt, kt, vt, block_mask=bm), doutt), doc_causal


def metadata_build(s: Length, out: Rows, doc_causal: Any) -> None:
    """Block-sparse metadata: flex's create_block_mask (``doc_causal`` None: no flex), the eager
    mask and the CUDA-graph builder, which must build the eager mask's tensors."""
    import torch

    from fa4cache.masks import DocumentMaskBuilder, make_document_mask

    T, cu = s.row.T, s.row.cu
    if doc_causal is not None:
        from torch.nn.attention.flex_attention import create_block_mask

        out.meta.append(
            [
                T,
                "flex create_block_mask",
                bench_ms(lambda: create_block_mask(doc_causal, 1, 1, T, T, device="cuda")),
            ]
        )
    out.meta.append(
        [
            T,
            "fa4cache make_document_mask (eager)",
            bench_ms(lambda: make_document_mask(cu, seqlen=T, validate=False)),
        ]
    )
    builder = DocumentMaskBuilder(T, max_documents=len(s.row.lens) + 8)
    builder(cu)
    out.meta.append([T, "fa4cache DocumentMaskBuilder (CUDA graph)", bench_ms(lambda: builder(cu))])
    built = builder(cu)
    same = all(
        torch.equal(getattr(built.block_sparse_tensors, f), getattr(s.mask.block_sparse_tensors, f))
        for f in ("mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx")
    )
    out.data.setdefault("builder_matches_eager", []).append(same)


def main_table(s: Length, methods: Methods, out: Rows) -> None:
    """Every method against FA4 varlen (checked against it before timing anything)."""
    r = s.row
    ref = methods["FA4 varlen (anchor)"][0]().detach().float()
    res: dict[str, dict[str, float]] = {}
    for name, (fwd, g) in methods.items():
        o = (
            fwd().detach().float().reshape(ref.shape)
            if "flex" not in name
            else fwd().detach().transpose(1, 2).float().reshape(ref.shape)
        )
        err = rel_err(o, ref)
        t_f = bench_ms(fwd)

        def fb(fwd: Any = fwd, g: Any = g) -> None:
            fwd().backward(g)

        t_fb = bench_ms(fb)
        res[name] = {"fwd_ms": t_f, "fwd_bwd_ms": t_fb, "rel_err_vs_varlen": err}
    # Useful work: causal attention inside each document.
    flops_fwd = sum(4 * n * (n + 1) / 2 * r.D * r.H for n in r.lens)
    anchor = res["FA4 varlen (anchor)"]
    for name, x in res.items():
        out.main.append(
            [
                r.T,
                name,
                x["fwd_ms"],
                x["fwd_bwd_ms"],
                f"{100 * anchor['fwd_ms'] / x['fwd_ms']:.0f}%",
                f"{100 * anchor['fwd_bwd_ms'] / x['fwd_bwd_ms']:.0f}%",
                flops_fwd * 3.5 / (x["fwd_bwd_ms"] * 1e-3) / 1e12,
                f"{x['rel_err_vs_varlen']:.1e}",
            ]
        )
    out.data["runs"].append({"tokens": r.T, "documents": len(r.lens), "results": res})


def versus_anchor(s: Length, out_rows: list[list[Any]], methods: Methods) -> None:
    # The first method is the anchor; a failure must not cost the main table.
    T, H, D = s.row.T, s.row.H, s.row.D
    try:
        ref = None
        got = {}
        for name, (fwd, g) in methods.items():
            o = fwd().detach().float().reshape(T, H, D)
            ref = o if ref is None else ref
            t_f = bench_ms(fwd)
            t_fb = bench_ms(lambda fwd=fwd, g=g: fwd().backward(g))
            got[name] = (t_f, t_fb, rel_err(o, ref))
        (af, afb, _), *_ = got.values()
        for name, (t_f, t_fb, err) in got.items():
            out_rows.append(
                [T, name, t_f, t_fb, f"{100 * af / t_f:.0f}%", f"{100 * afb / t_fb:.0f}%", f"{err:.1e}"]
            )
    except Exception as e:
        out_rows.append([T, f"failed: {type(e).__name__}: {str(e)[:120]}", "", "", "", "", ""])


def varlen_causal(r: PackedRow) -> Any:
    """FA4 varlen causal over the row's q/k/v, with the documents ``cu_`` and any other options."""
    from flash_attn.cute import flash_attn_varlen_func

    q, k, v = r.q, r.k, r.v

    def varlen(cu_: Any, maxlen_: int, **kw: Any) -> Any:
        return first(
            flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=cu_, cu_seqlens_k=cu_, max_seqlen_q=maxlen_,
                max_seqlen_k=maxlen_, causal=True, **kw,
            )
        )  # fmt: skip

    return varlen


def sliding_window(s: Length, out: Rows) -> None:
    """Sliding window inside documents: the same mask code, anchored on FA4 varlen's own
    local attention."""
    from flash_attn.cute import flash_attn_func

    r, w, win = s.row, s.window, s.win
    varlen, cu, maxlen, q4, k4, v4 = varlen_causal(r), r.cu, r.maxlen, r.q4, r.k4, r.v4
    versus_anchor(
        s,
        out.window,
        {
            f"FA4 varlen, window {w} (anchor)": (
                lambda: varlen(cu, maxlen, window_size=(w, 0)),
                r.dout,
            ),
            f"fa4cache document mask, window {w}": (
                lambda: first(flash_attn_func(q4, k4, v4, **win)),
                r.dout4,
            ),
        },
    )


def aligned_documents(s: Length, out: Rows) -> None:
    """Documents whose lengths are multiples of 128: no tile straddles a boundary, so the
    mask computes exactly varlen's tiles. The gap left here is FA4's block-sparse path
    itself; the rest of the gap in the main table is the straddling tiles."""
    from flash_attn.cute import flash_attn_func

    from fa4cache.masks import make_document_mask

    r, T = s.row, s.row.T
    lens_al = [max(256, n // 128 * 128) for n in r.lens]
    while sum(lens_al) > T:
        i = max(range(len(lens_al)), key=lens_al.__getitem__)
        lens_al[i] -= min(128, sum(lens_al) - T)
    lens_al[-1] += T - sum(lens_al)
    cu_al = cu_seqlens(lens_al)
    mask_al = make_document_mask(cu_al, seqlen=T)
    varlen, q4, k4, v4 = varlen_causal(r), r.q4, r.k4, r.v4
    versus_anchor(
        s,
        out.aligned,
        {
            "FA4 varlen (anchor)": (lambda: varlen(cu_al, max(lens_al)), r.dout),
            "fa4cache document mask": (lambda: first(flash_attn_func(q4, k4, v4, **mask_al)), r.dout4),
        },
    )


def batch_of_two(s: Length, out: Rows) -> None:
    """Batch 2 through document_ids: both rows hold the same documents as the one-row case;
    the anchor is FA4 varlen over the 2T tokens. Checks every row's output too."""
    import torch
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    from fa4cache.masks import make_document_mask

    T, H, D, cu, maxlen = s.row.T, s.row.H, s.row.D, s.row.cu, s.row.maxlen
    try:
        ids2 = document_ids(s.row.lens).expand(2, T)
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
        errs = [rel_err(got2[r], ref2[r]) for r in range(2)]
        b_af, b_afb = bench_ms(anchor2), bench_ms(lambda: anchor2().backward(dout2))
        b_f, b_fb = bench_ms(ours2), bench_ms(lambda: ours2().backward(dout2.view(2, T, H, D)))
        out.batch.append([T, "FA4 varlen, 2 x T tokens (anchor)", b_af, b_afb, "100%", "100%", ""])
        out.batch.append([
            T, "fa4cache document mask, document_ids [2, T]", b_f, b_fb, f"{100 * b_af / b_f:.0f}%",
            f"{100 * b_afb / b_fb:.0f}%", " / ".join(f"{e:.1e}" for e in errs),
        ])  # fmt: skip
    except Exception as e:
        out.batch.append([T, f"failed: {type(e).__name__}: {str(e)[:120]}", "", "", "", "", ""])


def report(lengths: list[int], window: int, out: Rows) -> None:
    flex_rows = {(r[0], r[1]): r for r in out.main}
    ratios = []
    for T in lengths:
        ours = flex_rows.get((T, "fa4cache document mask"))
        fl = flex_rows.get((T, "flex_attention + BlockMask"))
        if ours and fl:
            ratios.append([T, fl[2] / ours[2], fl[3] / ours[3]])
    versus = ["tokens", "method", "fwd ms", "fwd+bwd ms", "fwd vs varlen", "fwd+bwd vs varlen"]
    sections = [
        (
            "Forward and forward+backward (median ms; % of FA4 varlen throughput)",
            table([*versus, "fwd+bwd TFLOP/s", "rel err"], out.main),
        ),
        (
            f"Sliding window {window} inside documents (median ms; % of FA4 varlen local)",
            table([*versus, "rel err"], out.window),
        ),
        (
            "Documents aligned to 128 tokens: no tile straddles a boundary (median ms)",
            table([*versus, "rel err"], out.aligned),
        ),
        (
            "Batch 2 (document_ids), the same documents in both rows (median ms; rel err per row)",
            table(["tokens/row", *versus[1:], "rel err"], out.batch),
        ),
        ("Block-sparse metadata build (median ms)", table(["tokens", "builder", "ms"], out.meta)),
        (
            "Forward tiles (128x128) computed",
            table(
                ["tokens", "masked (partial) tiles", "full tiles", "varlen diagonal tiles"],
                [
                    [t["tokens"], t["fwd_partial"], t["fwd_full"], t["varlen_diagonal"]]
                    for t in out.data["tiles"]
                ],
            ),
        ),
    ]
    if ratios:
        sections.append(("Speed-up over flex_attention (x)", table(["tokens", "fwd", "fwd+bwd"], ratios)))
    out.data["metadata"] = out.meta
    save("masks_h200", "Document-mask attention on the GPU", sections, out.data)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--no-flex", action="store_true")
    a = p.parse_args()

    install_fa4cache()
    out = Rows()
    for T in a.lengths:
        s = setup(T, a.heads, a.head_dim, a.window)
        record_tiles(s, out)
        methods = main_methods(s)
        doc_causal = None
        if not a.no_flex:
            methods["flex_attention + BlockMask"], doc_causal = flex_method(s)
        metadata_build(s, out, doc_causal)
        main_table(s, methods, out)
        sliding_window(s, out)
        aligned_documents(s, out)
        batch_of_two(s, out)
    report(a.lengths, a.window, out)


if __name__ == "__main__":
    main()
