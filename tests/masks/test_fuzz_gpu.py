"""Random masks on the GPU: every row of every batch against a float32 brute-force reference.

Each case draws a batch size (1-4), query/KV heads (MHA and GQA groups of 2, 3, 4 and 7),
a head dim (64, 96, 128, 192, 256; 192 with a value dim of 128), bf16 or fp16, how
q/k/v lie in memory (contiguous, ``[B, H, T, D]`` transposed, slices of one packed qkv
projection), the softmax scale, a total length (rarely a multiple of 128), a packing per
row (1-token documents,
boundaries on tile edges, rows with one document), a mask option (causal,
bidirectional, window, prefix-LM, draft-block), how the mask is given (``cu_seqlens``,
``document_ids``, ``DocumentMaskBuilder``) and the metadata path (Triton or PyTorch).
It checks:

* FA4's output and ``dq``/``dk``/``dv`` of every batch row against a float32 reference
  with the explicit boolean mask, as close as plain bf16 arithmetic gets, through both
  ``flash_attn_func(q, k, v, **mask)`` (block-sparse, global tile grid) and
  ``fa4cache.attention(q, k, v, mask)`` (FA4 varlen for document masks);
* the forward and backward block lists (also those refitted for head dims 192 and 256)
  against brute-force tile classification of the boolean mask (every visible tile listed, every "full" tile fully visible, no
  index twice), and the two metadata paths against each other.

``FA4CACHE_FUZZ_SEED`` replays a run; every failure message names the seed and the case.
Run on an H200: ``pytest -m gpu tests/masks/test_fuzz_gpu.py`` (8 shards of 26 cases).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

SHARDS = 8
CASES_PER_SHARD = 26  # 208 cases a run
BASE_SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED") or random.SystemRandom().randrange(1 << 30))
OPTIONS = ("causal", "bidirectional", "causal_window", "bidirectional_window", "prefix", "draft")


def _packing(rng: random.Random, T: int) -> list[int]:
    """Document boundaries ``[0, ..., T]`` of one row, biased towards the hard cases."""
    style = rng.random()
    if style < 0.15 or T < 3:
        return [0, T]  # one document
    cuts: set[int] = set()
    for _ in range(rng.choice([1, 2, 4, 8, 24])):
        r = rng.random()
        if r < 0.3 and T > 129:
            cuts.add(128 * rng.randint(1, (T - 1) // 128))  # ends on a tile edge
        elif r < 0.55:
            c = rng.randrange(1, T - 1)
            cuts |= {c, c + 1}  # a 1-token document
        else:
            cuts.add(rng.randrange(1, T))
    if rng.random() < 0.2:
        cuts |= {1, T - 1}  # 1-token documents at both ends
    return [0, *sorted(c for c in cuts if 0 < c < T), T]


def draw_case(rng: random.Random) -> dict[str, Any]:
    option = rng.choice(OPTIONS)
    source = "draft" if option == "draft" else rng.choice(["cu_seqlens", "document_ids", "builder"])
    if source == "builder" and option == "prefix":
        source = "document_ids"  # the builder has no prefix-LM option
    B = 1 if source in ("cu_seqlens", "builder") else rng.randint(1, 4)
    hkv = rng.choice([1, 2])
    group = rng.choice([1, 1, 2, 3, 4, 4, 7])  # 1: MHA; 7: Qwen2.5-0.5B's 14/2
    D, Dv = rng.choice([(64, 64), (96, 96), (128, 128), (128, 128), (192, 192), (192, 128), (256, 256)])
    case: dict[str, Any] = {
        "option": option,
        "source": source,
        "triton": rng.random() < 0.6,
        "B": B,
        "Hq": hkv * group,
        "Hkv": hkv,
        "D": D,
        "Dv": Dv,
        "dtype": rng.choice(["bfloat16", "bfloat16", "float16"]),
        "layout": rng.choice(["contiguous", "contiguous", "bhtd", "qkv"]),
        "scale": None if rng.random() < 0.7 else round(rng.uniform(0.03, 0.3), 4),
    }
    if option == "draft":
        case["context_len"] = rng.randint(1, 700)
        case["blocks"] = rng.randint(1, 10)
        case["anchors"] = [
            [rng.randrange(case["context_len"]) for _ in range(case["blocks"])] for _ in range(B)
        ]
        return case
    T = rng.choice(
        [rng.randint(1, 1600), 128 * rng.randint(1, 10), 128 * rng.randint(1, 10) + rng.choice([-1, 1])]
    )
    case["T"] = max(T, 1)
    case["packings"] = [_packing(rng, case["T"]) for _ in range(B)]
    if "window" in option:
        case["window"] = rng.choice([0, 1, rng.randint(2, 300), 127, 128, 129])
    if option == "prefix":
        # At most each document's length (longer is an error).
        case["prefix"] = [
            [min(rng.randint(0, 400), p[i + 1] - p[i]) for i in range(len(p) - 1)] for p in case["packings"]
        ]
    return case


def build_mask(case: dict[str, Any], dev: str = "cuda") -> Any:
    import torch

    from fa4cache.masks import DocumentMaskBuilder, make_document_mask, make_draft_block_mask

    if case["option"] == "draft":
        anchors = torch.tensor(case["anchors"], device=dev)
        return make_draft_block_mask(anchors, context_len=case["context_len"], draft_block_size=16)
    kw: dict[str, Any] = {
        "causal": case["option"] in ("causal", "causal_window", "prefix"),
        "window": case.get("window"),
    }
    T = case["T"]
    if case["source"] == "builder":
        cu = torch.tensor(case["packings"][0], device=dev, dtype=torch.int32)
        build = DocumentMaskBuilder(T, max_documents=len(case["packings"][0]) + 3, device=dev, **kw)
        return build(cu)
    if case["source"] == "cu_seqlens":
        cu = torch.tensor(case["packings"][0], device=dev, dtype=torch.int32)
        if "prefix" in case:
            kw["prefix_lengths"] = torch.tensor(case["prefix"][0], device=dev)
        return make_document_mask(cu, seqlen=T, **kw)
    ids = torch.empty(case["B"], T, dtype=torch.int64)
    for b, cuts in enumerate(case["packings"]):
        for d in range(len(cuts) - 1):
            ids[b, cuts[d] : cuts[d + 1]] = 7 * d + b  # any ids; neighbours differ
    if "prefix" in case:
        width = max(len(p) for p in case["prefix"])
        p = torch.zeros(case["B"], width, dtype=torch.int64)
        for b, row in enumerate(case["prefix"]):
            p[b, : len(row)] = torch.tensor(row)
        kw["prefix_lengths"] = p.to(dev)
    return make_document_mask(document_ids=ids.to(dev), **kw)


def _flags(cnt: Any, idx: Any, cols: int) -> Any:
    """Boolean ``[B, R, cols]`` from FA4's (count, index list) form; raises on a repeated index."""
    import torch

    cnt, idx = cnt[:, 0].long(), idx[:, 0].long()
    B, R, C = idx.shape
    slot = torch.arange(C, device=idx.device).view(1, 1, C)
    used = slot < cnt.unsqueeze(-1)
    assert bool((cnt >= 0).all() and (cnt <= cols).all()), "count out of range"
    assert bool(((idx >= 0) & (idx < cols) | ~used).all()), "index out of range"
    hits = torch.zeros(B, R, cols + 1, dtype=torch.int64, device=idx.device)
    hits.scatter_add_(2, torch.where(used, idx, cols), used.long())
    assert int(hits[..., :cols].max()) <= 1, "an index listed twice"
    return hits[..., :cols].bool()


def check_block_lists(mask: Any, dense: Any, tensors: Any, transposed: bool) -> None:
    """The lists against brute-force tile classification of the boolean mask."""
    import torch

    bq, bk = tensors.block_size
    B, T, _ = dense.shape
    M, N = -(-T // bq), -(-T // bk)
    grid = torch.zeros(B, M * bq, N * bk, dtype=torch.bool, device=dense.device)
    grid[:, :T, :T] = dense
    tiles = grid.view(B, M, bq, N, bk)
    visible = tiles.any(4).any(2)  # [B, M, N]
    # Full: every real query row sees every key of a tile that lies inside the sequence.
    row_real = (torch.arange(M * bq, device=dense.device) < T).view(1, M, bq, 1, 1)
    all_seen = (tiles | ~row_real).all(4).all(2)
    inside = ((torch.arange(N, device=dense.device) + 1) * bk <= T).view(1, 1, N)
    full_ok = all_seen & inside
    if transposed:
        visible, full_ok = visible.transpose(1, 2), full_ok.transpose(1, 2)
    cols = visible.shape[-1]
    partial = _flags(tensors.mask_block_cnt, tensors.mask_block_idx, cols)
    full = _flags(tensors.full_block_cnt, tensors.full_block_idx, cols)
    assert not bool((partial & full).any()), "a tile listed as both partial and full"
    assert not bool((visible & ~(partial | full)).any()), "a visible tile is not listed"
    assert not bool((full & ~full_ok).any()), "a tile listed as full hides a key"


def _same_lists(a: Any, b: Any) -> None:
    import torch

    for cnt, idx in (("mask_block_cnt", "mask_block_idx"), ("full_block_cnt", "full_block_idx")):
        ca, cb = getattr(a, cnt), getattr(b, cnt)
        assert torch.equal(ca, cb), f"{cnt} differs between the metadata paths"
        ia, ib = getattr(a, idx), getattr(b, idx)
        used = torch.arange(ia.shape[-1], device=ia.device).view(1, 1, 1, -1) < ca.unsqueeze(-1)
        assert torch.equal(torch.where(used, ia, -1), torch.where(used, ib, -1)), (
            f"{idx} differs between paths"
        )


def _attention(q: Any, k: Any, v: Any, dense: Any, scale: float, exact: bool) -> Any:
    """Reference attention: float32 arithmetic (``exact``), or SDPA in the inputs' dtype."""
    import torch

    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    if exact:
        s = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * scale
        s = s.masked_fill(~dense[:, None], float("-inf"))
        return torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v.float())
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=dense[:, None], scale=scale
    )
    return o.transpose(1, 2)


def _lay_out(q: Any, k: Any, v: Any, layout: str) -> tuple[Any, Any, Any]:
    """``q``/``k``/``v`` (``[B, T, H, D]``) as views with another memory layout, differentiably:
    ``bhtd``: stored ``[B, H, T, D]``; ``qkv``: slices of one ``[B, T, Hq + 2 Hkv, D]`` tensor, as
    a fused projection gives them (``bhtd`` when the value dim differs)."""
    import torch

    if layout == "qkv" and q.shape[-1] == v.shape[-1]:
        packed = torch.cat([q, k, v], dim=2)
        hq, hkv = q.shape[2], k.shape[2]
        return packed[:, :, :hq], packed[:, :, hq : hq + hkv], packed[:, :, hq + hkv :]
    if layout in ("bhtd", "qkv"):
        return tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # type: ignore[return-value]
    return q, k, v


def _grads(fn: Any, q: Any, k: Any, v: Any, dout: Any, layout: str = "contiguous") -> list[Any]:
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(*_lay_out(qq, kk, vv, layout))
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dout)
    return [out.detach(), qq.grad, kk.grad, vv.grad]


def check_attention(mask: Any, case: dict[str, Any], seed: int) -> None:
    import torch
    from flash_attn.cute import flash_attn_func

    import fa4cache

    torch.manual_seed(seed)
    B, T, dev = mask.batch, mask.seqlen, "cuda"
    dtype = getattr(torch, case.get("dtype", "bfloat16"))
    D, Dv = case["D"], case.get("Dv", case["D"])
    layout, given_scale = case.get("layout", "contiguous"), case.get("scale")
    scale = D**-0.5 if given_scale is None else given_scale
    q = torch.randn(B, T, case["Hq"], D, device=dev, dtype=dtype)
    k = torch.randn(B, T, case["Hkv"], D, device=dev, dtype=dtype)
    v = torch.randn(B, T, case["Hkv"], Dv, device=dev, dtype=dtype)
    dout = torch.randn(B, T, case["Hq"], Dv, device=dev, dtype=dtype)
    dense = mask.dense()
    ref = _grads(lambda a, b, c: _attention(a, b, c, dense, scale, exact=True), q, k, v, dout)
    base = _grads(lambda a, b, c: _attention(a, b, c, dense, scale, exact=False), q, k, v, dout)
    paths = {
        "flash_attn_func(**mask)": lambda a, b, c: flash_attn_func(
            a, b, c, softmax_scale=given_scale, **mask
        ),
        "fa4cache.attention": lambda a, b, c: fa4cache.attention(a, b, c, mask, softmax_scale=given_scale),
    }
    if case["Hq"] != case["Hkv"] and Dv != D:
        # FA4's own limit ("GQA backward requires head_dim == head_dim_v");
        # fa4cache.attention expands k/v there.
        del paths["flash_attn_func(**mask)"]
    for path, fn in paths.items():
        got = _grads(fn, q, k, v, dout, layout)
        for name, g, r, bl in zip(("out", "dq", "dk", "dv"), got, ref, base):
            assert g.shape == r.shape, f"{path}: {name}: shape {tuple(g.shape)}, expected {tuple(r.shape)}"
            assert bool(torch.isfinite(g).all()), f"{path}: {name}: non-finite values"
            for row in range(B):
                rn = r[row].float().norm().clamp_min(1e-12)
                err = float((g[row].float() - r[row].float()).norm() / rn)
                berr = float((bl[row].float() - r[row].float()).norm() / rn)
                assert err <= 2 * berr + 2e-3, (
                    f"{path}: {name} of batch row {row}: rel err {err:.2e}, {dtype} baseline {berr:.2e}"
                )


def run_case(case: dict[str, Any], seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4CACHE_TRITON", "1" if case["triton"] else "0")
    mask = build_mask(case)
    dense = mask.dense()
    check_block_lists(mask, dense, mask.block_sparse_tensors, transposed=False)
    check_block_lists(mask, dense, mask.block_sparse_tensors_bwd, transposed=True)
    fitted = mask.for_head_dim(case["D"])  # other key tiles at head dims 192 and 256
    if fitted is not mask:
        check_block_lists(fitted, dense, fitted.block_sparse_tensors, transposed=False)
        check_block_lists(fitted, dense, fitted.block_sparse_tensors_bwd, transposed=True)
    if case["source"] != "builder":
        monkeypatch.setenv("FA4CACHE_TRITON", "0" if case["triton"] else "1")
        other = build_mask(case)
        _same_lists(mask.block_sparse_tensors, other.block_sparse_tensors)
        _same_lists(mask.block_sparse_tensors_bwd, other.block_sparse_tensors_bwd)
    check_attention(mask, case, seed)


@pytest.mark.parametrize("shard", range(SHARDS))
def test_random_masks_match_reference(shard: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import fa4cache

    fa4cache.install()
    failures = []
    for i in range(CASES_PER_SHARD):
        seed = BASE_SEED + shard * 1000 + i
        case = draw_case(random.Random(seed))
        try:
            run_case(case, seed, monkeypatch)
        except Exception as e:  # collect every failing case of the shard, then fail once
            failures.append(
                f"FA4CACHE_FUZZ_SEED={BASE_SEED} case seed {seed}: {case}\n    {type(e).__name__}: {e}"
            )
    assert not failures, f"{len(failures)} of {CASES_PER_SHARD} cases failed:\n" + "\n".join(failures)
