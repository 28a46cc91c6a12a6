"""Split-KV decoding (fa4cache/decode/split_kv.py): the compiled path's decode call split in
chunks of keys and combined gives the attention of the unsplit call.

FA4 is its CPU model here (tests/helpers/fa4_varlen_model.py, with FA4's LSE layout), so
the chunk sequences, the repeated queries and the combine run as on the GPU, held to a dense
reference over random shapes, paddings and caches (the seed is printed). The Triton forms
(key ranges with SPLITS, the combine) are held to the PyTorch forms through Triton's
interpreter; the H200 run is tests/adapters/transformers/test_generation_gpu.py's."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fa4cache.decode import kv_cache, launch, split_kv  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.helpers import fa4_varlen_model  # noqa: E402
from tests.helpers.switches import set_switch  # noqa: E402

SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))


def test_plan_fills_the_sms_with_whole_tiles() -> None:
    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    rng = random.Random(SEED)
    # The H200 shapes measured (benchmarks/results/decode_split_h200.md): batch 1 and 8 with 4
    # KV heads, batch 8 with 8, batch 32 (no split).
    assert split_kv.plan(4, 2048, 132) == (16, 128)
    assert split_kv.plan(32, 2048, 132) == (4, 512)
    assert split_kv.plan(64, 4096, 132) == (2, 2048)
    assert split_kv.plan(128, 2048, 132) is None
    assert split_kv.plan(4, split_kv.MIN_KEYS - 1, 132) is None
    for _ in range(2000):
        n, keys, sms = rng.randint(1, 300), rng.randint(1, 40000), rng.choice([8, 78, 132, 148])
        got = split_kv.plan(n, keys, sms)
        if got is None:
            assert keys < split_kv.MIN_KEYS or n * 2 > sms or keys <= split_kv.CHUNK_ALIGN, (
                n,
                keys,
                sms,
            )
            continue
        s, c = got
        assert 2 <= s <= split_kv.MAX_SPLITS and s & (s - 1) == 0, (n, keys, sms, got)
        assert n * s <= sms and c % split_kv.CHUNK_ALIGN == 0, (n, keys, sms, got)
        assert (s - 1) * c < keys <= s * c, (n, keys, sms, got)  # no chunk empty of slots, none left out


@pytest.fixture
def fa4_model(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """FA4's forward as its CPU model; the calls it got (their kwargs) in the list."""
    calls: list[dict[str, Any]] = []

    def stand_in(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        calls.append(
            {
                "q": tuple(q.shape),
                "q_dense": q.is_contiguous(),
                **{n: kw.get(n) for n in ("max_seqlen_k", "lse")},
            }
        )
        return fa4_varlen_model.flash_attn_fwd(q, k, v, **kw)[0]

    monkeypatch.setattr(launch, "_fa4_forward", stand_in)
    monkeypatch.setenv("FLASH_ATTENTION_NUM_SMS", "132")
    set_switch(monkeypatch, "FA4CACHE_DECODE_SPLIT", None)
    return calls


def _case(rng: random.Random) -> tuple[Any, ...]:
    B, Hkv, g = rng.randint(1, 4), rng.randint(1, 4), rng.choice([1, 2, 4])
    D, Tk = rng.choice([16, 32]), rng.randint(split_kv.MIN_KEYS, 2600)
    query = torch.randn(B, Hkv * g, 1, D)
    key, value = torch.randn(B, Hkv, Tk, D), torch.randn(B, Hkv, Tk, D)
    kind = rng.choice(["left", "static", "full", "position_ids"])
    mask = torch.ones(B, Tk, dtype=torch.long)
    pos = None
    for b in range(B):
        if kind == "left":  # left padding, up to most of the cache
            mask[b, : rng.randint(0, Tk - 1)] = 0
        elif kind == "static":  # a static buffer: padding, the tokens, then unused slots
            a = rng.randint(0, Tk // 2)
            mask[b, :a] = 0
            mask[b, rng.randint(a + 1, Tk) :] = 0
    if kind == "position_ids":
        mask = None
        pos = torch.tensor([[rng.randint(0, Tk - 1)] for _ in range(B)])
    softcap = rng.choice([0.0, 0.0, 30.0])
    return (
        query,
        key,
        value,
        mask,
        pos,
        softcap,
        f"B={B} Hkv={Hkv} g={g} D={D} Tk={Tk} {kind} softcap={softcap}",
    )


def test_the_split_call_equals_the_attention_over_the_whole_cache(fa4_model: list[dict[str, Any]]) -> None:
    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    rng = random.Random(SEED)
    for case in range(25):
        query, key, value, mask, pos, softcap, what = _case(rng)
        fa4_model.clear()
        got = kv_cache.forward(query, key, value, mask, pos, True, None, 0.25, softcap)
        want = fa4_varlen_model.kv_cache_reference(query, key, value, mask, pos, True, None, 0.25, softcap)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5, msg=f"seed {SEED} case {case}: {what}")
        plan = split_kv.plan(key.shape[0] * key.shape[1], key.shape[2], 132)
        (call,) = fa4_model
        if plan is None:
            assert call["lse"] is None, what
            continue
        s, c = plan
        assert call["q"][0] == s * key.shape[0] * key.shape[1] and call["max_seqlen_k"] == c, (what, call)
        # A dense query at every batch (one sequence too): its broadcast dims are in FA4's key.
        assert call["lse"] is not None and call["q_dense"], what


def test_what_does_not_split(fa4_model: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    query, key, value = torch.randn(1, 8, 1, 16), torch.randn(1, 2, 2048, 16), torch.randn(1, 2, 2048, 16)
    mask = torch.ones(1, 2048, dtype=torch.long)
    mask[:, :100] = 0
    want = fa4_varlen_model.kv_cache_reference(query, key, value, mask, None, True, None, 0.25)

    def split_calls(window: int | None = None, share: bool = False) -> int:
        fa4_model.clear()
        got = kv_cache.forward(query, key, value, mask, None, True, window, 0.25, 0.0, share=share)
        if window is None:
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        return sum(c["lse"] is not None for c in fa4_model)

    assert split_calls() == 1  # the op body (the compiled path) splits
    assert split_calls(share=True) == 0  # the eager path, bound by the host, does not
    assert split_calls(window=100) == 0  # a chunk's query would not see its window
    fa4_model.clear()
    big = torch.randn(1, 2, 2048, 256)  # past MAX_HEAD_DIM
    kv_cache.forward(torch.randn(1, 8, 1, 256), big, big, mask, None, True, None, 0.25, 0.0)
    assert [c["lse"] for c in fa4_model] == [None]
    set_switch(monkeypatch, "FA4CACHE_DECODE_SPLIT", "0")
    assert split_calls() == 0
    set_switch(monkeypatch, "FA4CACHE_DECODE_SPLIT", "1")
    monkeypatch.setenv("FLASH_ATTENTION_NUM_SMS", "3")  # 2 sequences on 3 SMs: nothing to gain
    assert split_calls() == 0
    fa4_model.clear()
    kv_cache.forward(torch.randn(1, 8, 4, 16), key, value, mask, None, True, None, 0.25, 0.0)  # 4 queries
    assert [c["lse"] for c in fa4_model] == [None]


TRITON_CODE = r"""
import os, random, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from fa4cache.decode import key_ranges, split_kv, split_kv_triton
from tests.decode.test_key_ranges_triton import draw

seed = int(sys.argv[1])
rng = random.Random(seed)
done = 0
for case in range(int(sys.argv[2])):
    mask, heads_kv, keys, one_run, what = draw(rng)
    if not one_run:
        continue
    batch = mask.shape[0]
    splits = rng.choice([2, 4, 8, 16])
    chunk = max(1, -(-keys // splits))
    cu, used = key_ranges._sequences(mask, None, batch, heads_kv, keys)
    want = key_ranges.chunks(cu, used, splits, chunk)
    got = key_ranges.key_ranges_triton(mask, batch, heads_kv, keys, split=(splits, chunk))
    for g, w, name in zip(got, want, ("cu_seqlens_k", "seqused_k")):
        assert g.dtype == torch.int32 and torch.equal(g, w), f"seed {seed} case {case}: {what} S={splits}: {name}"
    # Every key of every sequence in exactly one chunk, in order.
    n = batch * heads_kv
    assert torch.equal(want[1].view(splits, n).sum(0), used), (seed, case)
    # The combine: Triton's equals PyTorch's, chunks without keys included.
    g_, dv = rng.choice([1, 3, 4]), rng.choice([16, 24, 64])
    parts = torch.randn(splits * n, 1, g_, dv)
    lse = torch.randn(splits * n, g_, 1) * 4
    lse[torch.rand(lse.shape) < 0.3] = float("-inf")
    if rng.random() < 0.5:
        lse.view(splits, n * g_)[:, 0] = float("-inf")  # a row without keys in any chunk
    out_t, out_p = torch.empty(n, 1, g_, dv), torch.empty(n, 1, g_, dv)
    import triton
    split_kv_triton.combine[(n * g_,)](parts, lse, out_t, n * g_, S=splits, D=dv,
                                            BS=triton.next_power_of_2(splits), BD=triton.next_power_of_2(dv))
    split_kv.combine(parts, lse, out_p, splits)
    torch.testing.assert_close(out_t, out_p, atol=1e-5, rtol=1e-5, msg=f"seed {seed} case {case}")
    done += 1
assert done > 0
print("ok")
"""


@pytest.mark.slow
def test_triton_forms_equal_the_pytorch_forms() -> None:
    pytest.importorskip("triton")
    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", TRITON_CODE, str(SEED), "30"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, f"FA4CACHE_FUZZ_SEED={SEED}:\n{p.stderr[-3000:]}"
    assert p.stdout.strip().endswith("ok")


def test_the_combine_weighs_chunks_by_their_lse() -> None:
    # Two chunks of one sequence: softmax over all keys = chunk outputs weighed by exp(lse).
    torch.manual_seed(SEED)
    q, k, v = torch.randn(1, 16), torch.randn(10, 16), torch.randn(10, 8)
    s = q @ k.T
    parts, lse = [], []
    for a, b in ((0, 4), (4, 10)):
        p = torch.softmax(s[:, a:b], -1)
        parts.append(p @ v[a:b])
        lse.append(torch.logsumexp(s[:, a:b], -1))
    out = torch.empty(1, 1, 1, 8)
    split_kv.combine(torch.stack(parts).view(2, 1, 1, 8), torch.stack(lse).view(2, 1, 1), out, 2)
    torch.testing.assert_close(out.view(1, 8), torch.softmax(s, -1) @ v)
    # No keys in any chunk: 0, as FA4 gives a query without keys.
    split_kv.combine(torch.randn(2, 1, 1, 8), torch.full((2, 1, 1), float("-inf")), out, 2)
    assert torch.equal(out, torch.zeros_like(out))
