"""On the GPU: FA4 with fa4cache masks against a float32 reference with the explicit mask.

Run on an H200 (sm_90): ``pytest -m gpu``. Skipped without a GPU.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.helpers.packing import run_lengths

pytestmark = pytest.mark.gpu


def _rel(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _reference(q: Any, k: Any, v: Any, dense: Any, dout: Any) -> tuple[Any, ...]:
    import torch

    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    s = torch.einsum("bthd,bshd->bhts", qf, kf) / q.shape[-1] ** 0.5
    s = s.masked_fill(~dense[:, None], float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), vf)
    o.backward(dout.float())
    return o, qf.grad, kf.grad, vf.grad


def _bf16_reference(q: Any, k: Any, v: Any, dense: Any, dout: Any) -> tuple[Any, ...]:
    # The same math in bf16: how far plain bf16 arithmetic lands from float32.
    import torch

    qb, kb, vb = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(
        qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), attn_mask=dense[:, None]
    ).transpose(1, 2)
    o.backward(dout)
    return o, qb.grad, kb.grad, vb.grad


def _check_against_reference(mask: Any, q: Any, k: Any, v: Any, dout: Any) -> None:
    """FA4 with ``mask``: output and gradients about as close to float32 as plain bf16 is."""
    import torch
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(q, k, v, **mask)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dout)
    dense = mask.dense()
    ref = _reference(q, k, v, dense, dout)
    base = _bf16_reference(q, k, v, dense, dout)
    for name, g, r, b in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad), ref, base):
        assert torch.isfinite(g).all(), name
        err, berr = _rel(g, r), _rel(b, r)
        assert err <= 2 * berr + 2e-3, f"{name}: rel err {err:.2e} vs bf16 baseline {berr:.2e}"


def _layout(rng: random.Random, T: int) -> list[int]:
    n = rng.randint(1, 8)
    cuts = sorted(rng.sample(range(1, T), n - 1)) if n > 1 else []
    return [0, *cuts, T]


CASES = [
    {"causal": True},
    {"causal": False},
    {"causal": True, "window": 100},
    {"causal": False, "window": 64},
    {"causal": True, "prefix": True},
    {"draft": 16},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("seed", range(3))
def test_fa4_with_mask_matches_reference(case: dict[str, Any], seed: int) -> None:
    import torch

    import fa4cache
    from fa4cache.masks import make_document_mask, make_draft_block_mask

    fa4cache.install()
    rng = random.Random(seed * 7 + len(str(case)))
    torch.manual_seed(seed)
    dev = "cuda"
    if "draft" in case:
        bs = case["draft"]
        ctx = rng.randint(200, 1500)
        K = rng.randint(2, 12)
        anchors = torch.tensor([[rng.randrange(ctx) for _ in range(K)] for _ in range(2)], device=dev)
        mask = make_draft_block_mask(anchors, context_len=ctx, draft_block_size=bs)
    else:
        T = rng.randint(300, 3000)
        cu = torch.tensor(_layout(rng, T), device=dev, dtype=torch.int32)
        kw: dict[str, Any] = {"causal": case["causal"], "window": case.get("window")}
        if case.get("prefix"):
            # At most each document's length (longer is an error).
            kw["prefix_lengths"] = torch.minimum(
                torch.randint(0, 300, (cu.numel() - 1,), device=dev), (cu[1:] - cu[:-1]).long()
            )
        mask = make_document_mask(cu, **kw)
    B, T, H, D = mask.batch, mask.seqlen, 4, 128
    q, k, v = (
        torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    mask.check(q)
    dout = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
    _check_against_reference(mask, q, k, v, dout)


@pytest.mark.parametrize(
    ("head_dim", "block_sparse"),
    # d=64: the backward's transposed (swap_AB) layout with 128x128 tiles; d=192 without
    # block sparsity: every tile masked, and a backward whose scores are not transposed
    # (R2P in the backward).
    [(64, True), (192, False)],
)
@pytest.mark.parametrize("causal", [True, False])
def test_other_head_dims_match_reference(head_dim: int, block_sparse: bool, causal: bool) -> None:
    import torch

    import fa4cache
    from fa4cache.masks import make_document_mask

    fa4cache.install()
    rng = random.Random(head_dim + causal)
    torch.manual_seed(head_dim)
    T = rng.randint(700, 2000)
    cu = torch.tensor(_layout(rng, T), device="cuda", dtype=torch.int32)
    mask = make_document_mask(cu, causal=causal, window=rng.choice([None, 90]), block_sparse=block_sparse)
    q, k, v = (
        torch.randn(1, T, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    _check_against_reference(mask, q, k, v, torch.randn_like(q))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_interval_masking_matches_element_wise_mask_mod(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The two ways of masking partial tiles (R2P row intervals, FA4's per-score mask_mod)
    # must keep exactly the same scores: outputs and gradients agree to rounding.
    import torch
    from flash_attn.cute import flash_attn_func

    import fa4cache
    from fa4cache.masks import ROW_INTERVALS_ATTR, make_document_mask, make_draft_block_mask

    fa4cache.install()
    rng = random.Random(11 + len(str(case)))
    torch.manual_seed(3)
    dev = "cuda"

    def build() -> Any:
        if "draft" in case:
            anchors = torch.tensor([[rng.randrange(700) for _ in range(6)] for _ in range(2)], device=dev)
            return make_draft_block_mask(anchors, context_len=700, draft_block_size=case["draft"])
        cu = torch.tensor(_layout(rng, 2500), device=dev, dtype=torch.int32)
        kw: dict[str, Any] = {"causal": case["causal"], "window": case.get("window")}
        if case.get("prefix"):
            # At most each document's length (longer is an error).
            kw["prefix_lengths"] = torch.minimum(
                torch.randint(0, 300, (cu.numel() - 1,), device=dev), (cu[1:] - cu[:-1]).long()
            )
        return make_document_mask(cu, **kw)

    from fa4cache.adapters.fa4 import interval_masking
    from flash_attn.cute import mask as fa_mask

    # The comparison means something only where the patch is in: on an FA4 whose release does
    # not list it, run with FA4CACHE_TRY_COUPLINGS=interval_masking to verify it there.
    assert interval_masking.enable() and getattr(
        fa_mask.AttentionMask.apply_mask, interval_masking._PATCHED_MARK
    )
    fast = build()
    state = rng.getstate()
    monkeypatch.setenv("FA4CACHE_INTERVAL_MASKING", "0")
    rng.setstate(state)
    slow_mod = build().mask_mod
    slow = dict(fast)
    slow["mask_mod"] = slow_mod
    assert getattr(slow_mod, ROW_INTERVALS_ATTR, None) is None
    B, T = fast.batch, fast.seqlen
    q, k, v = (torch.randn(B, T, 4, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(B, T, 4, 128, device=dev, dtype=torch.bfloat16)
    results = []
    for kw in (dict(fast), slow):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = flash_attn_func(qq, kk, vv, **kw)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(dout)
        results.append((out, qq.grad, kk.grad, vv.grad))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        assert _rel(a, b) < 1e-3, name


def test_geometry_changes_do_not_recompile() -> None:
    import torch
    from flash_attn.cute import flash_attn_func

    import fa4cache
    from fa4cache.masks import make_document_mask

    store = fa4cache.install()
    rng = random.Random(5)
    q = None
    # Warm up one kernel set, then count compiles over fresh layouts and lengths.
    for i in range(12):
        T = rng.randint(256, 4096)
        cu = torch.tensor(_layout(rng, T), device="cuda", dtype=torch.int32)
        mask = make_document_mask(cu)
        q = torch.randn(1, T, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = flash_attn_func(q, q, q, **mask)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
        if i == 0:
            compiles_after_first = store.counters.values["compiles"]
    torch.cuda.synchronize()
    assert store.counters.values["compiles"] == compiles_after_first


def test_metadata_build_is_sync_free_and_graph_capturable() -> None:
    import torch

    from fa4cache.masks import make_document_mask

    cu = torch.tensor([0, 1000, 5000, 9000, 16384], device="cuda", dtype=torch.int32)
    make_document_mask(cu, seqlen=16384, validate=False)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        m = make_document_mask(cu, seqlen=16384, validate=False)
    g.replay()
    torch.cuda.synchronize()
    ref = make_document_mask(cu, seqlen=16384)
    assert torch.equal(m.block_sparse_tensors.mask_block_cnt, ref.block_sparse_tensors.mask_block_cnt)
    assert torch.equal(m.aux_tensors[0], ref.aux_tensors[0])


def test_builder_matches_eager_masks() -> None:
    import torch

    from fa4cache.masks import DocumentMaskBuilder, make_document_mask

    rng = random.Random(11)
    T = 8192
    build = DocumentMaskBuilder(T, max_documents=16, window=None)
    for _ in range(6):
        cu = torch.tensor(_layout(rng, T), device="cuda", dtype=torch.int32)
        got = build(cu)
        ref = make_document_mask(cu)
        torch.cuda.synchronize()
        assert torch.equal(got.aux_tensors[0], ref.aux_tensors[0])
        for f in ("mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx"):
            assert torch.equal(getattr(got.block_sparse_tensors, f), getattr(ref.block_sparse_tensors, f)), f
            assert torch.equal(
                getattr(got.block_sparse_tensors_bwd, f), getattr(ref.block_sparse_tensors_bwd, f)
            ), f


def test_finer_backward_blocks_give_the_same_gradients() -> None:
    import torch
    from flash_attn.cute import flash_attn_func

    import fa4cache
    from fa4cache.masks import make_document_mask

    fa4cache.install()
    T = 3000
    cu = torch.tensor([0, 700, 710, 2100, T], device="cuda", dtype=torch.int32)
    q, k, v = (
        torch.randn(1, T, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    grads = []
    for bwd in (None, (64, 128)):
        m = make_document_mask(cu, bwd_sparse_tile=bwd)
        out = flash_attn_func(q, k, v, **m)
        (out[0] if isinstance(out, tuple) else out).float().square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for a, b in zip(*grads):
        assert _rel(a, b) < 1e-2


def test_triton_metadata_matches_torch_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from fa4cache.masks import make_document_mask, make_draft_block_mask

    rng = random.Random(3)
    for _ in range(5):
        T = rng.randint(1000, 20000)
        cu = torch.tensor(_layout(rng, T), device="cuda", dtype=torch.int32)
        anchors = torch.randint(0, 500, (2, 6), device="cuda")
        window = rng.choice([None, 300])  # drawn once: both paths must see the same mask
        for build in (
            lambda cu=cu, window=window: make_document_mask(cu, window=window),
            lambda anchors=anchors: make_draft_block_mask(anchors, context_len=500, draft_block_size=16),
        ):
            monkeypatch.setenv("FA4CACHE_TRITON", "1")
            a = build()
            monkeypatch.setenv("FA4CACHE_TRITON", "0")
            b = build()
            for x, y in (
                (a.block_sparse_tensors, b.block_sparse_tensors),
                (a.block_sparse_tensors_bwd, b.block_sparse_tensors_bwd),
            ):
                assert torch.equal(x.mask_block_cnt, y.mask_block_cnt) and torch.equal(
                    x.full_block_cnt, y.full_block_cnt
                )
                for r in range(x.mask_block_cnt.shape[-1]):
                    c = int(x.mask_block_cnt[0, 0, r])
                    assert torch.equal(x.mask_block_idx[0, 0, r, :c], y.mask_block_idx[0, 0, r, :c])
                    f = int(x.full_block_cnt[0, 0, r])
                    assert torch.equal(x.full_block_idx[0, 0, r, :f], y.full_block_idx[0, 0, r, :f])


def test_attention_step_is_graph_capturable() -> None:
    # A whole step captured once: mask metadata (no host sync with validate=False) and
    # fa4cache.attention on the varlen path; replayed with new packings of the same total
    # length, equal to eager calls.
    import torch

    import fa4cache
    from fa4cache.masks import make_document_mask

    fa4cache.install()
    rng = random.Random(21)
    T, H, D = 4096, 4, 128
    q, k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    static_cu = torch.zeros(17, dtype=torch.int32, device="cuda")

    def stage(c: Any) -> None:
        static_cu.fill_(T)
        static_cu[: c.numel()].copy_(c)

    def step() -> Any:
        return fa4cache.attention(q, k, v, make_document_mask(static_cu, seqlen=T, validate=False))

    stage(torch.tensor(_layout(rng, T), device="cuda", dtype=torch.int32))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    for _ in range(4):
        cu = torch.tensor(_layout(rng, T), device="cuda", dtype=torch.int32)
        stage(cu)
        g.replay()
        ref = fa4cache.attention(q, k, v, make_document_mask(cu, seqlen=T))
        torch.cuda.synchronize()
        assert _rel(out, ref) < 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_softcap_matches_reference_on_every_path(seed: int) -> None:
    # Logit softcapping inside FA4 (forward and backward score_mods) through each path of
    # fa4cache.attention: one varlen call (document causal / window), two (prefix-LM) and
    # the dense block-sparse path (draft-block), random shapes, GQA and batch 2, against
    # float32 with cap * tanh(s / cap) applied before the mask.
    import torch

    import fa4cache
    from fa4cache.masks import make_document_mask, make_draft_block_mask

    fa4cache.install()
    rng = random.Random(1000 + seed)
    B, hkv = rng.choice([1, 2]), rng.choice([1, 2])
    hq, D = hkv * rng.choice([1, 2, 3]), rng.choice([64, 128])
    T = rng.choice([700, 1024, 1537])
    cap = rng.choice([2.0, 5.0, 30.0])
    ids = torch.cumsum(torch.rand(B, T) < 3 / T, 1).cuda()
    masks = {
        "document": make_document_mask(document_ids=ids),
        "window": make_document_mask(document_ids=ids, window=rng.choice([63, 200])),
        "prefix": make_document_mask(
            document_ids=ids,
            prefix_lengths=torch.minimum(
                torch.randint(0, 300, (B, int(ids.max()) + 1), device="cuda"),
                run_lengths(ids, int(ids.max()) + 1),
            ),
        ),
        "draft": make_draft_block_mask(
            torch.sort(torch.randint(0, T // 2, (B, (T - T // 2) // 16), device="cuda"), 1).values,
            context_len=T // 2,
            draft_block_size=16,
        ),
    }
    for name, mask in masks.items():
        n = mask.seqlen
        # Scores large enough for the cap to bite (unit normals give |s| up to ~4).
        q = (3 * torch.randn(B, n, hq, D, device="cuda")).to(torch.bfloat16).requires_grad_()
        k, v = (
            torch.randn(B, n, hkv, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2)
        )
        dout = torch.randn(B, n, hq, D, device="cuda", dtype=torch.bfloat16)
        out = fa4cache.attention(q, k, v, mask, softcap=cap)
        out.backward(dout)
        qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
        g = hq // hkv
        s = torch.einsum("bthd,bshd->bhts", qf, kf.repeat_interleave(g, 2)) / D**0.5
        s = (cap * torch.tanh(s / cap)).masked_fill(~mask.dense()[:, None], float("-inf"))
        ref = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), vf.repeat_interleave(g, 2))
        ref.backward(dout.float())
        for what, got, want in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad),
                                   (ref, qf.grad, kf.grad, vf.grad)):  # fmt: skip
            err = _rel(got, want)
            assert err < 2e-2, f"seed {seed} {name} B={B} {hq}/{hkv} d={D} T={T} cap={cap}: {what} {err:.2e}"
