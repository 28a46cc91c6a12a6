"""On the CPU: mask semantics, block-sparse metadata and hashes, against brute force."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fa4cache.errors import ConfigError  # noqa: E402
from fa4cache.masks import make_document_mask, make_draft_block_mask  # noqa: E402
from fa4cache.masks.blocksparse import classify_tiles  # noqa: E402
from tests.conftest import ROOT, run_worker  # noqa: E402
from tests.helpers.fa4_varlen_model import call_pairs, sequence_rows  # noqa: E402


def brute_document(doc_of: list[int], causal: bool, window: int | None, prefix: dict[int, int] | None) -> Any:
    """The definition, one (q, k) pair at a time. Documents are the runs of equal ids."""
    T = len(doc_of)
    run = [0] * T
    for j in range(1, T):
        run[j] = run[j - 1] + (doc_of[j] != doc_of[j - 1])
    start = {}
    for i in range(T):
        start.setdefault(run[i], i)
    out = torch.zeros(T, T, dtype=torch.bool)
    for q in range(T):
        s = start[run[q]]
        for k in range(T):
            if run[k] != run[q]:
                continue
            if causal:
                p = (prefix or {}).get(run[q], 0)
                if q < s + p:  # inside the prefix: the whole prefix, both ways
                    ok = k < s + p
                else:
                    ok = k <= q and (window is None or q - k <= window)
            else:
                ok = window is None or abs(q - k) <= window
            out[q, k] = ok
    return out


def twin(mask: Any) -> Any:
    """Pure-torch twin of the mask_mod: the same formula, on the aux tensors it reads."""
    T = mask.seqlen
    q = torch.arange(T).view(T, 1)
    k = torch.arange(T).view(1, T)
    out = []
    for b in range(mask.batch):
        if mask.mask_mod.__fa4cache_mask__["template"] == "fa4cache.draft_block":
            bs = mask.mask_mod.__fa4cache_mask__["spec"]["draft_block_size"]
            c = mask.aux_tensors[0][b, :T].view(T, 1).long()
            s = mask.aux_tensors[1][b, :T].view(T, 1).long()
            out.append((k < c) | ((k >= s) & (k < s + bs)))
        elif len(mask.aux_tensors) == 1:
            lo = mask.aux_tensors[0][b, :T].view(T, 1).long()
            out.append((k >= lo) & (k <= q))
        else:
            lo = mask.aux_tensors[0][b, :T].view(T, 1).long()
            hi = mask.aux_tensors[1][b, :T].view(T, 1).long()
            out.append((k >= lo) & (k < hi))
    return torch.stack(out)


def random_layout(rng: random.Random, T: int) -> list[int]:
    n = rng.randint(1, min(6, T))
    cuts = sorted(rng.sample(range(1, T), n - 1)) if n > 1 else []
    bounds = [0, *cuts, T]
    return [d for d in range(n) for _ in range(bounds[d + 1] - bounds[d])]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("variant", ["causal", "bidirectional", "window", "bidir_window", "prefix"])
def test_document_mask_matches_definition(seed: int, variant: str) -> None:
    rng = random.Random(seed * 31 + sum(map(ord, variant)))
    T = rng.randint(5, 70)
    doc_of = random_layout(rng, T)
    n_docs = doc_of[-1] + 1
    cu = torch.tensor([0] + [sum(1 for d in doc_of if d <= i) for i in range(n_docs)])
    causal = variant in ("causal", "window", "prefix")
    window = rng.randint(0, 9) if "window" in variant else None
    # A prefix is at most its document's length (longer is an error, tested below).
    prefix = (
        {d: min(rng.randint(0, 8), doc_of.count(d)) for d in range(n_docs)} if variant == "prefix" else None
    )
    kw: dict[str, Any] = {"causal": causal, "window": window}
    if prefix is not None:
        kw["prefix_lengths"] = torch.tensor([prefix[d] for d in range(n_docs)])
    expected = brute_document(doc_of, causal, window, prefix)
    m = make_document_mask(cu, **kw)
    assert torch.equal(m.dense()[0], expected)
    assert torch.equal(twin(m)[0], expected)
    # The same mask from document ids (2 rows with different layouts).
    doc2 = random_layout(rng, T)
    ids = torch.tensor([doc_of, [d + 100 for d in doc2]])
    kw2 = dict(kw)
    if prefix is not None:
        n2 = doc2[-1] + 1
        width = max(n_docs, n2)
        p1 = [prefix.get(d, 0) for d in range(width)]
        p2 = [min(prefix.get(d, 0), doc2.count(d)) for d in range(width)]
        kw2["prefix_lengths"] = torch.tensor([p1, p2])
        prefix2 = {d: p2[d] for d in range(n2)}
    else:
        prefix2 = None
    m2 = make_document_mask(document_ids=ids, **kw2)
    assert torch.equal(m2.dense()[0], expected)
    assert torch.equal(m2.dense()[1], brute_document(doc2, causal, window, prefix2))
    assert torch.equal(twin(m2), m2.dense())


@pytest.mark.parametrize("seed", range(5))
def test_draft_block_mask_matches_definition(seed: int) -> None:
    rng = random.Random(seed)
    bs = rng.choice([2, 3, 4, 8])
    ctx = rng.randint(1, 40)
    K = rng.randint(1, 5)
    anchors = torch.tensor([[rng.randrange(ctx) for _ in range(K)] for _ in range(2)])
    m = make_draft_block_mask(anchors, context_len=ctx, draft_block_size=bs)
    T = ctx + K * bs
    for b in range(2):
        exp = torch.zeros(T, T, dtype=torch.bool)
        for q in range(T):
            for k in range(T):
                if q < ctx:
                    exp[q, k] = k <= q
                else:
                    j = (q - ctx) // bs
                    own = ctx + j * bs <= k < ctx + (j + 1) * bs
                    exp[q, k] = own or k <= int(anchors[b, j])
        assert torch.equal(m.dense()[b], exp)
        assert torch.equal(twin(m)[b], exp)


def brute_tiles(dense: Any, bq: int, bk: int) -> tuple[Any, Any]:
    B, T, S = dense.shape
    M, N = -(-T // bq), -(-S // bk)
    partial = torch.zeros(B, M, N, dtype=torch.bool)
    full = torch.zeros(B, M, N, dtype=torch.bool)
    for b in range(B):
        for i in range(M):
            for j in range(N):
                tile = dense[b, i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
                whole_width = (j + 1) * bk <= S
                if tile.all() and whole_width:
                    full[b, i, j] = True
                elif tile.any():
                    partial[b, i, j] = True
    return partial, full


@pytest.mark.parametrize("seed", range(8))
def test_block_sparse_metadata_matches_brute_force(seed: int) -> None:
    rng = random.Random(1000 + seed)
    T = rng.randint(20, 300)
    bq, bk = rng.choice([(8, 8), (16, 8), (8, 16), (32, 32)])
    doc_of = random_layout(rng, T)
    ids = torch.tensor([doc_of])
    kw: dict[str, Any] = {"causal": rng.random() < 0.7}
    if rng.random() < 0.4:
        kw["window"] = rng.randint(0, 40)
    m = make_document_mask(document_ids=ids, block_sparse=False, **kw)
    exp_p, exp_f = brute_tiles(m.dense(), bq, bk)
    part, full = classify_tiles(*m.intervals, seqlen_q=T, seqlen_k=T, block_q=bq, block_k=bk)
    # Tiles this small are for checking the classification only (FA4 needs 64 and up).
    from fa4cache.masks.blocksparse import block_sparse_tensors

    fwd_t, bwd_t = block_sparse_tensors(*m.intervals, seqlen_q=T, seqlen_k=T, block_size=(bq, bk))
    # Document masks are monotone intervals: the closed form is exact.
    assert torch.equal(full, exp_f)
    assert torch.equal(part, exp_p)
    fwd = fwd_t
    for i in range(part.shape[1]):
        cnt = int(fwd.mask_block_cnt[0, 0, i])
        assert fwd.mask_block_idx[0, 0, i, :cnt].tolist() == torch.nonzero(part[0, i]).flatten().tolist()
        fcnt = int(fwd.full_block_cnt[0, 0, i])
        assert fwd.full_block_idx[0, 0, i, :fcnt].tolist() == torch.nonzero(full[0, i]).flatten().tolist()
    bwd = bwd_t
    for j in range(part.shape[2]):
        cnt = int(bwd.mask_block_cnt[0, 0, j])
        assert bwd.mask_block_idx[0, 0, j, :cnt].tolist() == torch.nonzero(part[0, :, j]).flatten().tolist()


@pytest.mark.parametrize("seed", range(4))
def test_draft_block_metadata_is_safe(seed: int) -> None:
    # Two intervals per row: the closed form may call a full tile partial, never the reverse,
    # and never skips a tile with a visible key.
    rng = random.Random(seed)
    ctx, K, bs = rng.randint(8, 100), rng.randint(1, 6), rng.choice([4, 8, 16])
    anchors = torch.tensor([[rng.randrange(ctx) for _ in range(K)]])
    m = make_draft_block_mask(anchors, context_len=ctx, draft_block_size=bs, block_sparse=False)
    exp_p, exp_f = brute_tiles(m.dense(), 16, 16)
    part, full = classify_tiles(*m.intervals, seqlen_q=m.seqlen, seqlen_k=m.seqlen, block_q=16, block_k=16)
    assert not (full & ~exp_f).any()
    assert not ((exp_p | exp_f) & ~(part | full)).any()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cu_seqlens": torch.tensor([0, 5, 3, 9])}, "cu_seqlens: offsets must be non-decreasing"),
        ({"cu_seqlens": torch.tensor([1, 5])}, "cu_seqlens: must start at 0"),
        ({"cu_seqlens": torch.tensor([0.0, 5.0])}, "cu_seqlens: expected an integer dtype"),
        ({"cu_seqlens": torch.tensor([0, 2**40])}, "cu_seqlens: values do not fit in int32"),
        ({"cu_seqlens": torch.tensor([0, 5]), "seqlen": 6}, "does not match seqlen=6"),
        ({"cu_seqlens": torch.tensor([0, 5]), "window": -1}, "window: expected a non-negative int"),
        (
            {"cu_seqlens": torch.tensor([0, 5]), "causal": False, "prefix_lengths": torch.tensor([1])},
            "prefix_lengths",
        ),
        (
            {"cu_seqlens": torch.tensor([0, 5]), "prefix_lengths": torch.tensor([1, 2])},
            r"prefix_lengths: expected shape \[1\]",
        ),
        ({}, "exactly one of cu_seqlens or document_ids"),
        ({"document_ids": torch.zeros(5, dtype=torch.long)}, "document_ids: expected \\[batch, seqlen\\]"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_document_mask(**kwargs)


def test_check_against_q() -> None:
    m = make_document_mask(torch.tensor([0, 10, 30]))
    m.check(torch.empty(1, 30, 2, 64))
    with pytest.raises(ValueError, match="does not match the mask's batch=1, seqlen=30"):
        m.check(torch.empty(1, 31, 2, 64))
    with pytest.raises(ValueError, match="anchors: every anchor must lie in the context"):
        make_draft_block_mask(torch.tensor([[5]]), context_len=5, draft_block_size=4)


def test_mask_is_a_mapping_for_flash_attn_func() -> None:
    m = make_document_mask(torch.tensor([0, 100, 300]))
    kw = dict(**m)
    assert set(kw) == {"mask_mod", "aux_tensors", "block_sparse_tensors", "block_sparse_tensors_bwd"}
    assert kw["aux_tensors"][0].dtype == torch.int32 and kw["aux_tensors"][0].is_contiguous()


@pytest.mark.slow
def test_hashes_stable_across_processes_and_seeds(tmp_path: Any) -> None:
    a = run_worker(tmp_path, "hashes", PYTHONHASHSEED="1")
    b = run_worker(tmp_path, "hashes", PYTHONHASHSEED="777")
    keys = ("causal", "interval", "draft16", "draft8")
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert len({a[k] for k in keys}) == 4  # each specialisation its own code, its own hash
    assert a["same_object"] is True
    from fa4cache.masks import interval_mask

    assert interval_mask(causal=True).__cute_hash__ == a["causal"]
    # Geometry never reaches the hash.
    m1 = make_document_mask(torch.tensor([0, 3, 50]))
    m2 = make_document_mask(torch.tensor([0, 40, 41, 90, 100]), window=7)
    assert m1.mask_mod is m2.mask_mod
    assert str(ROOT)  # the worker ran from the repository


def test_interval_masking_is_part_of_the_specialisation(monkeypatch: pytest.MonkeyPatch) -> None:
    from fa4cache.masks import ROW_INTERVALS_ATTR, draft_block_mask, interval_mask

    ENV_INTERVAL_MASKING = "FA4CACHE_INTERVAL_MASKING"

    # Defaults are part of the specialisation: spelling them out changes nothing.
    assert interval_mask(causal=True) is interval_mask(causal=True, row_intervals=True)
    fast = make_document_mask(torch.tensor([0, 100, 300]))
    assert getattr(fast.mask_mod, ROW_INTERVALS_ATTR, None) is not None
    monkeypatch.setenv(ENV_INTERVAL_MASKING, "0")
    slow = make_document_mask(torch.tensor([0, 100, 300]))
    assert getattr(slow.mask_mod, ROW_INTERVALS_ATTR, None) is None
    # Different generated code, different hash: the two never share a cache entry.
    assert slow.mask_mod.__cute_hash__ != fast.mask_mod.__cute_hash__
    assert (
        draft_block_mask(draft_block_size=8, row_intervals=False).__cute_hash__
        != draft_block_mask(draft_block_size=8).__cute_hash__
    )
    with pytest.raises(ConfigError, match="unexpected keyword"):
        interval_mask(causal=True, rows=True)


def test_the_fa4_masking_patch_is_part_of_the_toolchain() -> None:
    # Kernels traced by a patched FA4 are another code generator's output: the patch's
    # source digest names a toolchain of its own, and moves when the patch's source does.
    from fa4cache.adapters.fa4 import interval_masking

    from fa4cache.fingerprint import toolchain

    digest = interval_masking.source_digest()
    assert toolchain(90).id != toolchain(90, ((interval_masking.NAME, digest),)).id
    assert (
        toolchain(90, (("interval_masking", digest),)).id
        != toolchain(90, (("interval_masking", "0" * 16),)).id
    )


def _varlen_dense(mask: Any) -> Any:
    """The boolean [B, T, T] mask that fa4cache.attention's FA4 varlen calls compute from
    ``mask.varlen``; also checks that the calls' query rows are disjoint and cover every
    token, and that the first call's keys cover every token (what the backward relies on)."""
    B, T = mask.batch, mask.seqlen
    n = B * T
    full = torch.zeros(n, n, dtype=torch.bool)
    rows = torch.zeros(n, dtype=torch.long)
    for i, call in enumerate(mask.varlen.calls):
        keep, has_rows = call_pairs(call, n)
        full |= keep
        rows += has_rows.long()
        if i == 0:
            assert bool((sequence_rows(call.cu_seqlens_k, call.seqused_k, n)[0] >= 0).all())
    assert bool((rows == 1).all()), "every query row belongs to exactly one call"
    return torch.stack([full[b * T : (b + 1) * T, b * T : (b + 1) * T] for b in range(B)])


def _singlecall_pairs(mask: Any) -> Any:
    """The boolean [B, T, T] mask of ``mask.varlen_kwargs()`` (one flash_attn_varlen_func call)."""
    lay = mask.varlen
    B, T = mask.batch, mask.seqlen
    n = B * T
    if lay.mask_mod is None:
        keep, _ = call_pairs(lay.calls[0], n)
    else:  # prefix-LM: the document_prefix template's rule
        seq, local = sequence_rows(lay.cu_seqlens, None, n)
        plen = lay.aux_tensors[0].long()[seq].view(-1, 1)
        m, k = local.view(-1, 1), local.view(1, -1)
        window = lay.mask_mod.__fa4cache_mask__["spec"]["window"]
        after = (k <= m) & (m >= plen) & (k >= (m - window if window is not None else 0))
        keep = (seq.view(-1, 1) == seq.view(1, -1)) & (after | ((k < plen) & (m < plen)))
    return torch.stack([keep[b * T : (b + 1) * T, b * T : (b + 1) * T] for b in range(B)])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_varlen_layout_is_the_same_mask(seed: int) -> None:
    # fa4cache.attention runs document masks as FA4 varlen calls: over random packings
    # (batch > 1, 1-token documents, tile-edge boundaries, every option, every input form)
    # the calls and their masking keep exactly the reference's (query, key) pairs, and so
    # does the single-call form of mask.varlen_kwargs().
    from tests.masks.test_fuzz_gpu import build_mask, draw_case

    rng = random.Random(1000 + seed)
    checked = 0
    while checked < 40:
        case = draw_case(rng)
        if case["option"] == "draft" or case["T"] * case["B"] > 1500:
            continue
        mask = build_mask(case, dev="cpu")
        assert mask.varlen is not None
        ref = mask.dense()
        assert torch.equal(_varlen_dense(mask), ref), f"seed {seed}: {case}"
        assert torch.equal(_singlecall_pairs(mask), ref), f"seed {seed}: {case}"
        # No sequence crosses a row, and the unused tail is empty.
        cu = mask.varlen.cu_seqlens.long()
        assert int(cu[-1]) == mask.batch * mask.seqlen and bool((cu[1:] >= cu[:-1]).all())
        checked += 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_windowed_prefix_lm_on_varlen(seed: int) -> None:
    # Prefix-LM with a window (the fuzz draws none): prefixes of 0, inside and equal to the
    # document's length (past it is an error).
    rng = random.Random(seed)
    for _ in range(10):
        lens = [rng.choice([1, 2, 7, 64, 129, rng.randint(1, 300)]) for _ in range(rng.randint(1, 5))]
        cu = torch.tensor([0, *itertools.accumulate(lens)])
        prefix = torch.tensor([rng.choice([0, min(1, n), n // 2, n]) for n in lens])
        window = rng.choice([0, 1, 5, 64])
        mask = make_document_mask(cu, prefix_lengths=prefix, window=window)
        ref = mask.dense()
        assert torch.equal(_varlen_dense(mask), ref), (seed, lens, prefix.tolist(), window)
        assert torch.equal(_singlecall_pairs(mask), ref), (seed, lens, prefix.tolist(), window)


def test_varlen_needs_a_document_bound_without_validation() -> None:
    ids = torch.tensor([[0, 0, 1, 1, 2]])
    with pytest.raises(ValueError, match="max_documents"):
        make_document_mask(document_ids=ids, validate=False)
    m = make_document_mask(document_ids=ids, validate=False, max_documents=5)
    assert m.varlen.cu_seqlens.tolist() == [0, 2, 4, 5, 5, 5]
    with pytest.raises(RuntimeError, match="more documents than max_documents"):
        make_document_mask(document_ids=ids, validate=False, max_documents=2)
    with pytest.raises(ValueError, match="max_documents: expected a positive int"):
        make_document_mask(document_ids=ids, max_documents=0)


@pytest.mark.slow
def test_attention_under_torch_compile_runs_between_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    # fa4cache.attention inside a compiled function: FA4's Python interface is not
    # traceable, so the call runs eagerly between two graphs (one graph break) and the
    # result and gradients equal eager. FA4's varlen function is the float model of its
    # calls here (it needs a GPU), which dynamo would trace into and break inside many
    # times: the single break is fa4cache's own.
    import flash_attn.cute as fa

    import fa4cache
    from fa4cache.masks.varlen import VarlenCall
    from tests.helpers import fa4_varlen_model

    def varlen_func(q: Any, k: Any, v: Any, *, softmax_scale: Any = None, softcap: float = 0.0,
                    cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any, max_seqlen_k: Any, causal: bool,
                    window_size: Any) -> Any:  # fmt: skip
        call = VarlenCall(cu_seqlens_q, cu_seqlens_k, causal, window_size, max_seqlen_q)
        return fa4_varlen_model.forward(q, k, v, [call], softmax_scale, softcap)

    monkeypatch.setattr(fa, "flash_attn_varlen_func", varlen_func)
    lens = [5, 1, 17, 9]
    T = sum(lens)
    mask = make_document_mask(torch.tensor([0, *itertools.accumulate(lens)]), seqlen=T, window=6)
    torch.manual_seed(0)
    q = torch.randn(1, T, 4, 16, requires_grad=True)
    k, v = (torch.randn(1, T, 2, 16, requires_grad=True) for _ in range(2))

    def step(q: Any, k: Any, v: Any) -> Any:
        return (fa4cache.attention(q * 1.5, k, v, mask) ** 2).sum()

    explained = torch._dynamo.explain(step)(q, k, v)
    assert explained.graph_break_count == 1, explained.break_reasons
    got = torch.compile(step, backend="aot_eager")(q, k, v)
    grads = torch.autograd.grad(got, (q, k, v))
    want = step(q, k, v)
    torch.testing.assert_close(got, want)
    for g, w in zip(grads, torch.autograd.grad(want, (q, k, v))):
        torch.testing.assert_close(g, w)
    # ...and eager is the mask's own reference
    ref = fa4_varlen_model.mask_reference(q * 1.5, k, v, mask)
    torch.testing.assert_close(want, (ref**2).sum(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("softcap", [0.0, 0.7])
def test_the_varlen_model_backward_is_the_gradient_of_its_forward(softcap: Any) -> None:
    # The CPU stand-in for FA4's varlen calls writes its backward out by hand (autograd does
    # not record inside a custom op): held to autograd on its own forward, with and without
    # a softcap, over a two-call prefix-LM layout with GQA.
    from tests.helpers import fa4_varlen_model

    torch.manual_seed(3)
    lens = [5, 1, 9, 4]
    T = sum(lens)
    mask = make_document_mask(
        torch.tensor([0, *itertools.accumulate(lens)]), seqlen=T, prefix_lengths=torch.tensor([2, 0, 4, 4])
    )
    calls = mask.varlen.calls
    assert len(calls) == 2
    q = torch.randn(T, 4, 8, requires_grad=True)
    k, v = (torch.randn(T, 2, 8, requires_grad=True) for _ in range(2))
    out, lse = fa4_varlen_model.forward(q, k, v, calls, None, softcap)
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = fa4_varlen_model.backward(q, k, v, out.detach(), dout, lse, calls, None, softcap)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    if softcap:  # and the cap changes the result (the test sees a missing one)
        plain, _ = fa4_varlen_model.forward(q, k, v, calls, None)
        assert not torch.allclose(plain, out, atol=1e-3)
