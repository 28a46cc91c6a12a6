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
from dataclasses import dataclass, field
from typing import Any

from common import (
    PackedRow,
    bench_ms,
    causal_pairs,
    cu_seqlens,
    doc_lengths,
    document_ids,
    first,
    install_fa4cache,
    interleaved_ms,
    packed_row,
    rel_err,
    save,
    table,
)

D = 128  # head dim, every section
H = 16  # heads of the prefix-LM / window / draft section


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


@dataclass
class Rows:
    """The tables' rows over every length, and the JSON data."""

    plain: list[list[Any]] = field(default_factory=list)
    anatomy: list[list[Any]] = field(default_factory=list)
    ceiling: list[list[Any]] = field(default_factory=list)
    other: list[list[Any]] = field(default_factory=list)
    meta: list[list[Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=lambda: {"plain": [], "other": []})


def tile_ceiling_only(lengths: list[int]) -> None:
    rows = [r for T in lengths for r in ceiling_rows(T, other_documents(T))]
    save(
        "varlen_window_tile_ceiling",
        "FA4 sliding window: tile ceiling against causal (computed)",
        [(CEILING_HEADING, table(CEILING_COLUMNS, rows))],
        {"rows": rows},
    )


def fwd_bwd(fns: dict[str, tuple[Any, Any]]) -> dict[str, tuple[float, float]]:
    """Forward and forward+backward ms of each (fwd, dout), interleaved (common.interleaved_ms)."""
    f = interleaved_ms({n: fn for n, (fn, _) in fns.items()})
    fb = interleaved_ms({n: (lambda fn=fn, d=d: fn().backward(d)) for n, (fn, d) in fns.items()})
    return {n: (f[n], fb[n]) for n in fns}


def flops(pairs: float) -> float:  # forward+backward FLOPs of `pairs` visible (q, k) pairs
    return 4 * D * H * pairs * 3.5


def anatomy(r: PackedRow) -> list[list[Any]]:
    """Forward and backward apart, for FA4 varlen causal and FA4's own sliding window
    (the kernel fa4cache.attention calls for window masks) at several widths: where a
    window's useful TFLOP/s go, and how they grow with the keys each query sees."""
    from flash_attn.cute import flash_attn_varlen_func

    T, q, k, v, dout, cu, maxlen, lens = r.T, r.q, r.k, r.v, r.dout, r.cu, r.maxlen, r.lens
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


# ------------------------------------------------------------ plain document masks
def plain_documents(T: int, B: int, out: Rows) -> random.Random:
    """B rows of T tokens of documents, MHA and GQA, causal and bidirectional. Returns the
    rows' random generator: the prefix-LM and draft-block masks of the next section
    draw from the last one (so their data depend on --lengths, as they always did)."""
    import torch

    rng = random.Random(T * 10 + B)
    rows = [doc_lengths(T, rng, 512, 8192) for _ in range(B)]
    lens = [n for r in rows for n in r]
    cu_all = cu_seqlens(lens)
    ids = torch.stack([document_ids(r, device="cpu") for r in rows]).cuda()
    for Hq, Hkv in ((16, 16), (32, 8)):
        plain_heads(T, B, Hq, Hkv, lens, cu_all, ids, out)
        torch.cuda.empty_cache()
    return rng


def plain_heads(T: int, B: int, Hq: int, Hkv: int, lens: list[int], cu_all: Any, ids: Any, out: Rows) -> None:
    import torch
    from flash_attn.cute import flash_attn_varlen_func

    import fa4cache
    from fa4cache.masks import make_document_mask

    maxlen = max(lens)
    q = torch.randn(B * T, Hq, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.randn(B * T, Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)
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
        err = rel_err(ours().detach().float().reshape(ref.shape), ref)
        t = fwd_bwd({"anchor": (anchor, dout), "max": (ours_max, dout4), "none": (ours, dout4)})
        (af, afb), (mf, mfb), (nf, nfb) = t["anchor"], t["max"], t["none"]
        name = "causal" if causal else "bidirectional"
        out.plain.append([
            T, B, f"{Hq}/{Hkv}", name, af, afb,
            f"{100 * af / mf:.0f}%", f"{100 * afb / mfb:.0f}%",
            f"{100 * af / nf:.0f}%", f"{100 * afb / nfb:.0f}%", f"{err:.1e}",
        ])  # fmt: skip
        out.data["plain"].append(
            {"T": T, "B": B, "heads": [Hq, Hkv], "mask": name, "varlen": [af, afb],
             "with_max_seqlen": [mf, mfb], "without": [nf, nfb], "rel_err": err}
        )  # fmt: skip


# ------------------------------------------------------------ prefix-LM, window, draft
def other_cases(r: PackedRow, rng: random.Random) -> dict[str, tuple[Any, float]]:
    """The prefix-LM, sliding-window and draft-block masks of the row, each with its visible pairs."""
    import torch

    from fa4cache.masks import make_document_mask, make_draft_block_mask

    T, lens, cu, maxlen = r.T, r.lens, r.cu, r.maxlen
    prefix = torch.tensor([rng.randint(0, n // 2) for n in lens], device="cuda")
    window = 1024
    ctx = T // 2
    K = (T - ctx) // 16
    anchors = torch.tensor([sorted(rng.randrange(ctx) for _ in range(K))], device="cuda")
    return {
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


def mask_inputs(r: PackedRow, mask: Any) -> tuple[Any, Any, Any, Any]:
    """q, k, v, dout for ``mask``: the row's, or new ones of the mask's own length (the draft mask)."""
    import torch

    tq, tk, tv, td = (r.q4, r.k4, r.v4, r.dout4)
    if mask.seqlen != r.T:  # the draft mask's own length
        tq, tk, tv = (
            torch.randn(1, mask.seqlen, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        td = torch.randn(1, mask.seqlen, H, D, device="cuda", dtype=torch.bfloat16)
    return tq, tk, tv, td


def mask_paths(mask: Any, tq: Any, tk: Any, tv: Any, no_flex: bool) -> dict[str, Any]:
    """fa4cache.attention, the dense block-sparse path and (unless ``no_flex``) flex on ``mask``."""
    from flash_attn.cute import flash_attn_func

    import fa4cache

    paths = {
        "fa4cache.attention": lambda m=mask, a_=(tq, tk, tv): fa4cache.attention(*a_, m),
        "dense block-sparse path": lambda m=mask, a_=(tq, tk, tv): first(flash_attn_func(*a_, **m)),
    }
    if not no_flex:
        import torch
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
        paths["flex_attention"] = lambda bm=bm, a_=(qt, kt, vt): flex(*a_, block_mask=bm).transpose(1, 2)
    return paths


def fp32_error(mask: Any, ref: Any, tq: Any, tk: Any, tv: Any) -> float:
    """``ref``'s error against a float32 reference: agreement between methods alone would
    hide a shared error. NaN past 16K tokens (per head, [T, T] in float32)."""
    ours_err = float("nan")
    if mask.seqlen <= 16384:
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
    return ours_err


def time_mask(
    r: PackedRow, name: str, mask: Any, pairs: float, anchor: Any, no_flex: bool, out: Rows
) -> tuple[list[list[Any]], float]:
    """One mask's paths against the anchor, interleaved: its rows and the anchor's ms."""
    T, dout, anchor_pairs = r.T, r.dout, causal_pairs(r.lens)
    tq, tk, tv, td = mask_inputs(r, mask)
    paths = mask_paths(mask, tq, tk, tv, no_flex)
    ref = paths["fa4cache.attention"]().detach().float()
    errs = {path: rel_err(fn().detach().float(), ref) for path, fn in paths.items()}
    ours_err = fp32_error(mask, ref, tq, tk, tv)
    t = interleaved_ms(
        {"anchor": lambda: anchor().backward(dout)}
        | {path: (lambda fn=fn, d=td: fn().backward(d)) for path, fn in paths.items()}
    )
    anchor_tflops = flops(anchor_pairs) / (t["anchor"] * 1e-3) / 1e12
    rows = []
    for path in paths:
        tf = flops(pairs) / (t[path] * 1e-3) / 1e12
        rows.append([
            T, f"{name}: {path}", "varlen" if (path == "fa4cache.attention" and mask.varlen is not None) else "dense",
            t[path], tf, f"{100 * tf / anchor_tflops:.0f}%", f"{t[path] / t['fa4cache.attention']:.2f}x",
            f"{errs[path]:.1e}", f"{ours_err:.1e}" if path == "fa4cache.attention" else "",
        ])  # fmt: skip
    out.data["other"].append(
        {"T": T, "mask": name, "fwd_bwd_ms": {k_: t[k_] for k_ in t}, "rel_err_vs_ours": errs,
         "ours_rel_err_vs_fp32": ours_err}
    )  # fmt: skip
    return rows, t["anchor"]


def other_masks(T: int, rng: random.Random, no_flex: bool, out: Rows) -> None:
    """Prefix-LM, sliding window and draft-block masks against FA4 varlen causal, the
    anatomy of FA4's window, its tile ceiling and the metadata builders, on one row."""
    from flash_attn.cute import flash_attn_varlen_func

    r = packed_row(T, other_documents(T), H, D)
    q, k, v, cu, maxlen = r.q, r.k, r.v, r.cu, r.maxlen
    anchor_pairs = causal_pairs(r.lens)
    anchor = lambda: first(flash_attn_varlen_func(  # noqa: E731
        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=maxlen, max_seqlen_k=maxlen, causal=True
    ))  # fmt: skip
    anchor_ms: list[float] = []
    group_rows = []
    for name, (mask, pairs) in other_cases(r, rng).items():
        rows, ms = time_mask(r, name, mask, pairs, anchor, no_flex, out)
        group_rows.extend(rows)
        anchor_ms.append(ms)
    out.anatomy.extend(anatomy(r))
    out.ceiling.extend(ceiling_rows(T, r.lens))
    a_ms = sorted(anchor_ms)[len(anchor_ms) // 2]
    out.other.append(
        [T, "FA4 varlen causal (anchor, median of the groups)", "-", a_ms,
         flops(anchor_pairs) / (a_ms * 1e-3) / 1e12, "100%", "", "", ""]
    )  # fmt: skip
    out.other.extend(group_rows)
    metadata(r, out)


def metadata(r: PackedRow, out: Rows) -> None:
    from fa4cache.masks import DocumentMaskBuilder

    T, cu = r.T, r.cu
    builder = DocumentMaskBuilder(T, max_documents=len(r.lens) + 8, block_sparse=False)
    builder(cu)
    out.meta.append([T, "DocumentMaskBuilder (varlen layout only)", bench_ms(lambda: builder(cu), rep=150)])
    builder_bs = DocumentMaskBuilder(T, max_documents=len(r.lens) + 8)
    builder_bs(cu)
    out.meta.append(
        [T, "DocumentMaskBuilder (with block-sparse metadata)", bench_ms(lambda: builder_bs(cu), rep=150)]
    )


def report(out: Rows) -> None:
    sections = [
        (
            "Plain document masks through fa4cache.attention (% of FA4 varlen throughput; "
            "anchor median ms; interleaved timing, common.interleaved_ms)",
            table(
                ["tokens/row", "B", "heads q/kv", "mask", "varlen fwd ms", "varlen fwd+bwd ms",
                 "fwd, max_seqlen given", "fwd+bwd, max_seqlen given", "fwd, no max_seqlen",
                 "fwd+bwd, no max_seqlen", "rel err"],
                out.plain,
            ),
        ),
        (
            "Other masks, forward+backward: useful TFLOP/s vs FA4 varlen causal in the same run "
            "(x: time relative to fa4cache.attention; interleaved timing, common.interleaved_ms)",
            table(["tokens", "mask: method", "path", "fwd+bwd ms", "useful TFLOP/s", "vs varlen causal",
                   "time vs ours", "rel err vs ours", "ours: rel err vs fp32"], out.other),
        ),
        (
            "FA4 varlen causal and FA4's sliding window, forward and backward apart (same documents; "
            "backward = forward+backward minus forward; useful TFLOP/s; % of causal's in the same direction)",
            table(["tokens", "FA4 varlen", "keys per query", "fwd ms", "fwd TFLOP/s", "fwd vs causal",
                   "bwd ms", "bwd TFLOP/s", "bwd vs causal"], out.anatomy),
        ),
        (CEILING_HEADING, table(CEILING_COLUMNS, out.ceiling)),
        ("Metadata (median ms)", table(["tokens", "builder", "ms"], out.meta)),
    ]  # fmt: skip
    save("varlen_h200", "fa4cache.attention: per-document tiling on FA4 varlen", sections, out.data)


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
        tile_ceiling_only(a.other_lengths)
        return

    install_fa4cache()
    out = Rows()
    rng = None
    for T in a.lengths:
        for B in (1, 2):
            rng = plain_documents(T, B, out)
    for T in a.other_lengths:
        other_masks(T, rng, a.no_flex, out)
    report(out)


if __name__ == "__main__":
    main()
