"""Generation with a KV cache under ``attn_implementation="fa4cache"`` on the CPU.

FA4 cannot run here, so its forward is the CPU stand-in (``fa4_varlen_model.flash_attn_fwd``,
held to a dense reference below); everything else is real: transformers' models, caches
(dynamic, static, sliding) and generate, and the adapter's own cache plumbing
(``cu_seqlens_k``/``seqused_k`` over the cache as it lies, the custom op). Models are
random small configs in float32, compared with SDPA on the same weights.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import random
import zlib
from typing import Any

import pytest

from tests.helpers.switches import set_switch
from tests.helpers.transformers_compat import before_5_2x, cache_kwarg

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", "0"))

# transformers 5.2x renamed the model's `past_key_values` to `cache` (the old name warns); the
# tests call the model as the installed version names it, and any deprecation warning fails.
pytestmark = [
    pytest.mark.filterwarnings("error:.*past_key_values.*:FutureWarning"),
    pytest.mark.filterwarnings("error:.*paged.*:FutureWarning"),
]


CACHE = cache_kwarg()


@pytest.fixture
def fa4(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """The adapter registered, FA4 replaced by the stand-in; yields the KV-cache calls seen."""
    from fa4cache.adapters import transformers as fht

    from fa4cache.decode import launch
    from fa4cache.ops import step_mask, varlen_calls
    from tests.helpers import fa4_varlen_model

    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path / "store"))
    fht.register()
    seen: list[dict[str, Any]] = []

    def stand_in(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        seen.append(kw)
        return fa4_varlen_model.flash_attn_fwd(q, k, v, **kw)[0]

    monkeypatch.setattr(launch, "_fa4_forward", stand_in)
    # Prefill without a cache goes through the packed path: its FA4 calls modelled too.
    monkeypatch.setattr(varlen_calls, "forward", fa4_varlen_model.forward)
    monkeypatch.setattr(varlen_calls, "backward", fa4_varlen_model.backward)
    step_mask._cache.clear()
    fht._warned.clear()
    yield seen


def SMALL_PAGED_CACHE() -> Any:  # noqa: N802  (a constant, built when transformers is there)
    """A paged cache sized for a test's few prompts: transformers sizes it from the free memory
    of the device, which on a CPU host is its RAM (9 GB for a tiny model before)."""
    from transformers import ContinuousBatchingConfig

    return ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=256)


def _configs() -> dict[str, Any]:
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen3Config

    small = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    return {
        "llama-gqa": LlamaConfig(**small, num_attention_heads=8, num_key_value_heads=2, head_dim=16),
        "qwen3": Qwen3Config(**small, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        # Windows shorter than the prompt: decoding runs past them.
        "mistral-sliding": MistralConfig(
            **small, num_attention_heads=4, num_key_value_heads=2, sliding_window=6
        ),
        "gemma2-softcap": Gemma2Config(
            **small,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=5,
            attn_logit_softcapping=2.0,
            query_pre_attn_scalar=16,
        ),
    }


def _reference(cfg: Any) -> str:
    """SDPA, or eager where transformers has no SDPA path (softcapping: Gemma 2)."""
    return "eager" if getattr(cfg, "attn_logit_softcapping", None) else "sdpa"


def _model(cfg: Any, impl: str, seed: int = 0) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)  # the same weights for every implementation
    m = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.float32)
    assert m.config._attn_implementation == impl.removeprefix("paged|")  # transformers drops "paged|"
    return m.eval()


def _left_padded(rng: random.Random, batch: int, length: int, vocab: int) -> tuple[Any, Any]:
    # Tokens start at 1: generate reads a pad id (0) inside a row given no mask as a gap.
    ids = torch.randint(
        1, vocab, (batch, length), generator=torch.Generator().manual_seed(rng.randrange(1 << 30))
    )
    mask = torch.ones(batch, length, dtype=torch.long)
    for b in range(batch):
        mask[b, : rng.randrange(0, length - 2) if b else 0] = 0  # row 0 unpadded
    return ids.masked_fill(mask == 0, 0), mask


def _cache(kind: str, cfg: Any, max_len: int) -> Any:
    from transformers import DynamicCache, StaticCache

    return DynamicCache(config=cfg) if kind == "dynamic" else StaticCache(config=cfg, max_cache_len=max_len)


def _teacher_forced(model: Any, ids: Any, mask: Any, follow: Any, kind: str) -> list[Any]:
    """Logits of the prefill (``ids``, ``mask``) and of each step feeding ``follow[:, t]``,
    with position_ids as generate builds them."""
    cache = _cache(kind, model.config, ids.shape[1] + follow.shape[1] + 3)
    outs = []
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        outs.append(model(input_ids=ids, attention_mask=mask, position_ids=pos, **{CACHE: cache}).logits)
        for t in range(follow.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = mask.sum(-1, keepdim=True) - 1
            step = model(
                input_ids=follow[:, t : t + 1], attention_mask=mask, position_ids=pos, **{CACHE: cache}
            )
            outs.append(step.logits)
    return outs


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", list(_configs()))
def test_teacher_forced_decode_logits_match_sdpa(
    fa4: Any, caplog: Any, name: str, batch: int, kind: str
) -> None:
    seed = SEED + zlib.crc32(f"{name}{batch}{kind}".encode()) % 1000
    print(f"seed {seed}")
    rng = random.Random(seed)
    cfg = _configs()[name]
    m, ref = _model(cfg, "fa4cache"), _model(cfg, _reference(cfg))
    ids, mask = _left_padded(rng, batch, rng.randint(7, 12), cfg.vocab_size)
    follow = torch.randint(0, cfg.vocab_size, (batch, 8), generator=torch.Generator().manual_seed(seed))
    with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        got = _teacher_forced(m, ids, mask, follow, kind)
    want = _teacher_forced(ref, ids, mask, follow, kind)
    valid = mask.bool()
    torch.testing.assert_close(got[0][valid], want[0][valid], atol=2e-5, rtol=2e-5)
    for t, (a, b) in enumerate(zip(got[1:], want[1:])):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda s, t=t: f"step {t}: {s}")
    assert not [r for r in caplog.records if "runs through PyTorch" in r.getMessage()]
    # Every decode step of every layer ran on the (stand-in) FA4 call (and a static cache's
    # prefill, where its keys outnumber the queries).
    decode = [kw for kw in fa4 if kw["max_seqlen_q"] == 1]
    assert len(decode) == cfg.num_hidden_layers * follow.shape[1], len(fa4)


def test_kv_cache_attention_matches_a_dense_reference(fa4: Any) -> None:
    # The op alone, on random shapes: rows with left padding, a static buffer's unused tail,
    # several queries (prefill into the cache), windows, softcap, GQA; with a 2-D mask, and
    # with position_ids only (no padding).
    from fa4cache.decode import kv_cache
    from tests.helpers.fa4_varlen_model import kv_cache_reference

    rng = random.Random(SEED)
    print(f"seed {SEED}")
    for case in range(12):
        B, hkv, g, D = rng.randint(1, 4), rng.randint(1, 3), rng.choice([1, 2, 4]), 8
        L = rng.randint(2, 20)  # tokens so far (mask columns)
        Tk = L + rng.choice([0, 0, 5])  # a static buffer is longer
        Tq = rng.choice([1, 1, 2, min(L, 5)])
        use_mask = case % 3 != 0
        pads = [rng.randint(0, L - Tq) if use_mask else 0 for _ in range(B)]
        window = rng.choice([None, 1, 3])
        softcap = rng.choice([0.0, 1.5])
        gen = torch.Generator().manual_seed(case)
        q = torch.randn(B, hkv * g, Tq, D, generator=gen)
        k, v = (torch.randn(B, hkv, Tk, D, generator=gen) for _ in range(2))
        mask = torch.ones(B, L, dtype=torch.bool)
        for b, p in enumerate(pads):
            mask[b, :p] = False
        pos = torch.full((1, Tq), 0) + torch.arange(L - Tq, L)
        given = mask
        if use_mask and case % 2:  # as the mask hook pads it for a static cache
            given = torch.cat([mask, torch.zeros(B, Tk - L, dtype=torch.bool)], 1)
        out = kv_cache.forward(
            q, k, v, given if use_mask else None, None if use_mask else pos, True, window, D**-0.5, softcap
        )
        want = kv_cache_reference(q, k, v, given if use_mask else None, pos, True, window, D**-0.5, softcap)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5, msg=lambda m, c=case: f"case {c}: {m}")


def test_the_stand_in_matches_a_dense_reference() -> None:
    # The FA4 stand-in for keys flat (cu_seqlens_k + seqused_k, gaps between sequences),
    # paged (page_table over shuffled pages) and dense (seqused_k), queries dense or
    # varlen: each against plain masked attention of each sequence alone.
    from tests.helpers.fa4_varlen_model import capped, flash_attn_fwd

    rng = random.Random(SEED + 1)
    print(f"seed {SEED + 1}")
    for case in range(10):
        n, hk, g, D, page = rng.randint(1, 4), rng.randint(1, 2), rng.choice([1, 3]), 8, 4
        lk = [rng.randint(0, 13) for _ in range(n)]
        lq = [rng.randint(1, max(1, x)) if rng.random() < 0.5 else 1 for x in lk]
        causal, window = rng.choice([True, False]), rng.choice([None, 2])
        softcap = rng.choice([0.0, 2.0])
        gen = torch.Generator().manual_seed(case)
        ks = [torch.randn(x, hk, D, generator=gen) for x in lk]
        vs = [torch.randn(x, hk, D, generator=gen) for x in lk]
        qs = [torch.randn(x, hk * g, D, generator=gen) for x in lq]
        want = []
        for qi, ki, vi in zip(qs, ks, vs):
            p = torch.arange(ki.shape[0] - qi.shape[0], ki.shape[0]).view(-1, 1)
            j = torch.arange(ki.shape[0]).view(1, -1)
            ok = (j <= p if causal else torch.ones_like(j <= p)) & (
                j >= p - window if window is not None else torch.ones_like(j <= p)
            )
            if window is not None and not causal:
                ok &= j <= p + window
            s = capped(torch.einsum("qhd,khd->hqk", qi, ki.repeat_interleave(g, 1)) * D**-0.5, softcap)
            pr = torch.softmax(s.masked_fill(~ok, float("-inf")), -1).nan_to_num(0.0)
            want.append(torch.einsum("hqk,khd->qhd", pr, vi.repeat_interleave(g, 1)))
        kw = {"causal": causal, "softcap": softcap, "window_size_left": window}
        kw["window_size_right"] = 0 if causal and window is not None else window
        used = torch.tensor(lk, dtype=torch.int32)
        cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
        flat_q = torch.cat(qs)
        # Flat keys with a random gap before each sequence.
        gaps = [rng.randint(0, 3) for _ in range(n)]
        starts, parts_k, parts_v, at = [], [], [], 0
        for gap, ki, vi in zip(gaps, ks, vs):
            parts_k += [torch.randn(gap, hk, D), ki]
            parts_v += [torch.randn(gap, hk, D), vi]
            starts.append(at + gap)
            at += gap + ki.shape[0]
        cu_k = torch.tensor([*starts, at], dtype=torch.int32)
        out, _ = flash_attn_fwd(
            flat_q,
            torch.cat(parts_k),
            torch.cat(parts_v),
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            seqused_k=used,
            **kw,
        )
        torch.testing.assert_close(out, torch.cat(want), atol=1e-5, rtol=1e-5)
        # Paged: pages shuffled over a pool, the page table lists each sequence's pages.
        per = [max(1, -(-x // page)) for x in lk]
        order = torch.randperm(sum(per) + 2, generator=gen)
        kp, vp = (torch.randn(sum(per) + 2, page, hk, D) for _ in range(2))
        table = torch.zeros(n, max(per), dtype=torch.int32)
        used_pages = 0
        for i, (ki, vi) in enumerate(zip(ks, vs)):
            ids = order[used_pages : used_pages + per[i]]
            used_pages += per[i]
            table[i, : per[i]] = ids.to(torch.int32)
            for c, pid in enumerate(ids.tolist()):
                kp[pid, : ki[c * page : (c + 1) * page].shape[0]] = ki[c * page : (c + 1) * page]
                vp[pid, : vi[c * page : (c + 1) * page].shape[0]] = vi[c * page : (c + 1) * page]
        out, _ = flash_attn_fwd(flat_q, kp, vp, cu_seqlens_q=cu_q, page_table=table, seqused_k=used, **kw)
        torch.testing.assert_close(out, torch.cat(want), atol=1e-5, rtol=1e-5)
        # Dense keys padded at the end, dense queries (one query length for all).
        if len(set(lq)) == 1:
            T = max(lk) + 1
            kd, vd = torch.zeros(n, T, hk, D), torch.zeros(n, T, hk, D)
            for i, (ki, vi) in enumerate(zip(ks, vs)):
                kd[i, : lk[i]], vd[i, : lk[i]] = ki, vi
            out, _ = flash_attn_fwd(torch.stack(qs), kd, vd, seqused_k=used, **kw)
            torch.testing.assert_close(out, torch.stack(want), atol=1e-5, rtol=1e-5)


def _patterned_state(cfg: Any) -> dict[str, Any]:
    return _patterned_model(cfg).state_dict()


def _patterned_model(cfg: Any) -> Any:
    """A model trained briefly on a fixed pattern (token t follows t - 1 as (7 t + 3) mod V):
    its greedy choices are far from ties, so tokens must agree exactly between paths."""
    m = _model(cfg, "sdpa").train()
    opt = torch.optim.Adam(m.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(100):
        x = torch.randint(0, cfg.vocab_size, (16, 1), generator=gen)
        seq = [x]
        for _ in range(23):
            seq.append((seq[-1] * 7 + 3) % cfg.vocab_size)
        ids = torch.cat(seq, 1)
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


@pytest.mark.parametrize("name", ["qwen3", "mistral-sliding"])
def test_free_running_greedy_tokens_are_identical(fa4: Any, caplog: Any, name: str) -> None:
    cfg = copy.deepcopy(_configs()[name])
    trained = _patterned_model(cfg)
    state = trained.state_dict()
    m, ref = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    m.load_state_dict(state)
    ref.load_state_dict(state)
    rng = random.Random(SEED + 2)
    print(f"seed {SEED + 2}")
    ids, mask = _left_padded(rng, 8, 10, cfg.vocab_size)
    for b in range(8):  # prompts that follow the pattern after their padding
        n = int(mask[b].sum())
        tok = rng.randrange(cfg.vocab_size)
        for t in range(10 - n, 10):
            ids[b, t] = tok
            tok = (tok * 7 + 3) % cfg.vocab_size
    for cache in ("dynamic", "static"):
        # No end-of-sequence token: the pattern passes through it, and a row that stops is
        # padded, which is no choice of the model's.
        kw = {"max_new_tokens": 12, "do_sample": False, "attention_mask": mask, "eos_token_id": None,
              "pad_token_id": 0}  # fmt: skip
        if cache == "static":
            kw["cache_implementation"] = "static"
        with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
            out = m.generate(ids, **kw)
        want = ref.generate(ids, **kw)
        assert torch.equal(out, want), (cache, out, want)
        # Not near-flat: the model follows its pattern, so the comparison is of real choices.
        new = want[:, 10:]
        follows = ((new[:, :-1] * 7 + 3) % cfg.vocab_size == new[:, 1:]).float().mean()
        assert follows > 0.8, float(follows)
    assert not [r for r in caplog.records if "runs through PyTorch" in r.getMessage()]
    assert fa4, "the KV-cache path was not taken"


def test_what_cannot_run_on_fa4_falls_back_and_says_why(fa4: Any, caplog: Any) -> None:
    # A 4-D mask on a cache step: PyTorch, one warning naming it, SDPA's result.
    from transformers import DynamicCache

    cfg = _configs()["qwen3"]
    m, ref = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    ids = torch.randint(0, cfg.vocab_size, (1, 6))
    results = []
    for model in (m, ref):
        cache = DynamicCache(config=cfg)
        with torch.no_grad():
            model(input_ids=ids[:, :5], **{CACHE: cache})
            four_d = torch.ones(1, 1, 1, 6, dtype=torch.bool)
            with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
                results.append(model(input_ids=ids[:, 5:], attention_mask=four_d, **{CACHE: cache}).logits)
    torch.testing.assert_close(results[0], results[1], atol=2e-5, rtol=2e-5)
    msgs = [r.getMessage() for r in caplog.records if "runs through PyTorch" in r.getMessage()]
    assert len(msgs) == 1 and "4-D attention mask" in msgs[0], msgs
    assert not fa4


def test_a_mask_that_is_not_left_padding_is_refused(fa4: Any) -> None:
    from fa4cache.decode import kv_cache

    q, k = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 6, 8)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4] = False  # a gap: not one run of slots
    with pytest.raises(RuntimeError, match="one run of tokens"):
        kv_cache.forward(q, k, k, mask, None, True, None, 0.35, 0.0)
    mask[1, 4] = True
    mask[0, 0] = mask[0, -1] = False  # padding on both sides: one run, attended as such
    out = kv_cache.forward(q, k, k, mask, None, True, None, 0.35, 0.0)
    assert out.shape == (2, 1, 2, 8) and torch.isfinite(out).all()


DECODE_COMPILES = r"""
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
import fa4cache
from fa4cache.decode import choose, key_ranges, kv_cache, step_ranges

store = fa4cache.install()
# Decode steps of many batch sizes and cache lengths, full and sliding layers, through the
# op's body (FA4 on fake CUDA tensors; the per-row lengths are computed on the CPU first,
# as the masks of the packed path are).
# Batch 1, 2 and 4 over 1,500-3,000 keys split on the compiled path (fa4cache.decode.split_kv):
# one split kernel more, whatever the batch.
cases = [(1, 17, None), (5, 300, None), (64, 4096, None), (3, 33, 63), (40, 1000, 63), (1, 2048, None),
         (2, 3000, None), (4, 1500, None)]
splits = 0
for B, Tk, window in cases:
    mask = torch.ones(B, Tk - 3, dtype=torch.bool)
    mask[0, :5] = False
    split = choose.split_plan(B * 2, Tk, 128) if window is None else None
    splits += split is not None
    lengths = key_ranges._sequences(mask, None, B, 2, Tk, split=split)
    with FakeTensorMode(), torch.no_grad():
        fake = tuple(torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in lengths)
        step_ranges.sequences = lambda *a, fake=fake, **kw: fake
        q = torch.empty(B, 8, 1, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(B, 2, Tk, 128, dtype=torch.bfloat16, device="cuda")
        out = kv_cache.forward(q, k, k, mask, None, True, window, 0.088, 0.0)
        assert tuple(out.shape) == (B, 1, 8, 128)
assert splits == 3, splits
store.counters.flush()
print("RESULT", int(store.counters.values["compiles"]), int(store.counters.values["disk_hits"]))
"""


@pytest.mark.compile
def test_decode_shapes_compile_one_kernel_per_layer_kind(tmp_path: Any) -> None:
    # Real FA4 forward kernels, cross-compiled for sm_90: batch size and cache length are
    # not in FA4's compile key on this path (one kernel for full layers, one for sliding
    # ones, one for split full layers); a second process loads the three from the store.
    import subprocess
    import sys

    from tests.conftest import ROOT, worker_env

    def run() -> list[int]:
        p = subprocess.run(
            [sys.executable, "-c", DECODE_COMPILES], cwd=ROOT, env=worker_env(tmp_path / "store"),
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        return [int(x) for x in p.stdout.split("RESULT", 1)[1].split()]

    assert run() == [3, 0]
    assert run() == [0, 3]


@pytest.mark.compile
def test_warm_generation_from_a_model_config_covers_decoding(tmp_path: Any) -> None:
    # `fa4cache warm --hf-config PATH --generation` from config.json alone: afterwards the
    # decode steps above (full and sliding layers, split or not, any batch and cache length)
    # compile nothing and load the three kernels.
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT, run_cli, worker_env

    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    cfg = {
        "model_type": "qwen3", "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
        "hidden_size": 256, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"],
        "dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    w = run_cli(store, "warm", "--hf-config", str(tmp_path), "--no-backward", "--generation")
    assert w.returncode == 0, w.stderr[-3000:]
    assert "generation: 9 kernel kinds, 9 compiled" in w.stdout and "0 failed" in w.stdout, w.stdout
    p = subprocess.run(
        [sys.executable, "-c", DECODE_COMPILES], cwd=ROOT, env=worker_env(store),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split("RESULT", 1)[1].split() == ["0", "3"]


def test_generate_batch_runs_on_fa4_without_a_mask(
    fa4: Any, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Continuous batching (paged cache) with "fa4cache" (5.2x deprecates the "paged|" prefix): accepted,
    # attention one FA4 varlen call (cu_seqlens_q/cu_seqlens_k), no attention mask built;
    # greedy tokens as generate() gives each prompt alone with SDPA.
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching import input_outputs

    if before_5_2x():
        pytest.skip(
            "transformers 5.17's generate_batch cannot size its cache on a CPU, with sdpa too (GPU test)"
        )
    built = []
    real_build = input_outputs.build_attention_mask
    monkeypatch.setattr(
        input_outputs, "build_attention_mask", lambda *a, **k: built.append(1) or real_build(*a, **k)
    )
    cfg = copy.deepcopy(_configs()["mistral-sliding"])
    state = _patterned_state(cfg)
    m, ref = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    m.load_state_dict(state)
    ref.load_state_dict(state)
    rng = random.Random(SEED + 3)
    print(f"seed {SEED + 3}")
    prompts = []
    for n in (3, 9, 5, 12):
        tok = rng.randrange(cfg.vocab_size)
        prompts.append([])
        for _ in range(n):
            prompts[-1].append(tok)
            tok = (tok * 7 + 3) % cfg.vocab_size
    gen = GenerationConfig(max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=-1)
    with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        out = m.generate_batch(
            inputs=prompts,
            generation_config=gen,
            progress_bar=False,
            continuous_batching_config=SMALL_PAGED_CACHE(),
        )
    got = [out[k].generated_tokens for k in sorted(out, key=lambda r: int(r.split("_")[-1]))]
    for p, tokens in zip(prompts, got):
        want = ref.generate(
            torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        want = want[0, len(p) :].tolist()
        assert len(want) == 10 and tokens[:10] == want, (p, tokens, want)  # (generate_batch may run one more)
    assert not built
    assert not [r for r in caplog.records if "runs through PyTorch" in r.getMessage()]
    steps = [kw for kw in fa4 if kw.get("cu_seqlens_q") is not None]
    assert steps and all(kw["window_size_left"] == cfg.sliding_window - 1 for kw in steps)


def test_continuous_batching_gives_fa4cache_the_cuda_graph_default_of_flash_implementations(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # transformers 5.2x turns CUDA graphs and asynchronous batching on for an implementation
    # whose name says "flash" (it needs no mask); "fa4cache" needs none either and gets the same
    # default, while what a user sets stands. The CPU has no graphs: the accelerator is
    # said to have them, the rest is transformers' own resolution.
    init = pytest.importorskip("transformers.generation.continuous_batching.initialization")
    if not hasattr(init, "decide_use_cuda_graphs"):
        pytest.skip("this transformers decides no CUDA-graph default in continuous batching")
    if before_5_2x():
        pytest.skip("written against 5.2x's resolution (its device argument, get_accelerator_graph_name)")
    from fa4cache.adapters import transformers as fht
    from transformers import LlamaConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import continuous_api

    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path / "store"))  # never the user's
    fht.register()
    monkeypatch.setattr(init, "get_accelerator_graph_name", lambda: "CUDAGraph")

    def resolved(impl: str, **kw: Any) -> Any:
        cfg = LlamaConfig(num_hidden_layers=2)
        cfg._attn_implementation = impl
        r = continuous_api.resolve_continuous_batching_config(
            cfg, ContinuousBatchingConfig(**kw), None, False, device=torch.device("cpu")
        )
        return tuple(r.use_cuda_graph), r.use_async_batching

    flash = resolved("flash_attention_2")
    assert flash == ((True, True), True)  # transformers' own default, which ours follows
    assert resolved("fa4cache") == flash
    assert resolved("sdpa") == ((False, False), False)  # needs a mask: untouched
    assert resolved("fa4cache", use_cuda_graph=False) == ((False, False), False)
    assert resolved("fa4cache", use_async_batching=False) == ((True, True), False)


def test_continuous_batching_plans_fa4cache_memory_as_a_flash_implementation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # transformers sizes its paged cache for an implementation that is not "flash" by name as if
    # it had attention masks and repeated KV heads (eager/sdpa): "fa4cache" has neither, and
    # its cache is as large as a flash implementation's (80 GiB said free; the cache on "meta").
    cb_cache = pytest.importorskip("transformers.generation.continuous_batching.cache")
    init = pytest.importorskip("transformers.generation.continuous_batching.initialization")
    if not hasattr(cb_cache, "PagedAttentionMemoryHandler") or not hasattr(init, "decide_use_cuda_graphs"):
        pytest.skip("this transformers plans no such memory")
    if before_5_2x():
        pytest.skip("written against 5.2x's resolution (its device argument, get_accelerator_graph_name)")
    from fa4cache.adapters import transformers as fht
    from transformers import LlamaConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import continuous_api
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path / "store"))  # never the user's
    fht.register()
    monkeypatch.setattr(init, "get_accelerator_graph_name", lambda: "CUDAGraph")
    monkeypatch.setattr(
        cb_cache, "get_device_and_memory_breakdown", lambda: (torch.device("cuda"), 80 << 30, 0, 0)
    )

    def sectors(impl: str) -> int:
        cfg = LlamaConfig(num_hidden_layers=24, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                          num_key_value_heads=2, head_dim=64, vocab_size=151936)  # fmt: skip
        cfg._attn_implementation = impl
        resolved = continuous_api.resolve_continuous_batching_config(
            cfg, ContinuousBatchingConfig(), None, False, device=torch.device("cuda")
        )
        cache = cb_cache.PagedAttentionCache(
            cfg, resolved, "meta", DistributedHelper(None, 60, {}), dtype=torch.bfloat16
        )
        return int(cache.num_sectors)

    flash, ours, sdpa = sectors("flash_attention_2"), sectors("fa4cache"), sectors("sdpa")
    assert ours == flash > sdpa, (ours, flash, sdpa)


class _PagedCacheBefore523:
    """The contract of transformers 5.17's ``PagedAttentionCache.update`` for full-attention
    layers (the H200 image's transformers; this venv's newer one updates the cache in the
    model's layers instead, so its own class cannot show the older call): write the step's
    keys at ``write_index``, read each sequence's keys back at ``read_index`` as ``[tokens,
    Hkv, D]``; with nothing to read, return the step's keys."""

    def __init__(self, slots: int, heads_kv: int, dim: int) -> None:
        self.key_cache = [torch.zeros(slots, heads_kv, dim)]
        self.value_cache = [torch.zeros(slots, heads_kv, dim)]

    def update(
        self, key_states: Any, value_states: Any, layer_idx: int, read_index: Any, write_index: Any
    ) -> Any:
        k, v = (t.transpose(1, 2).squeeze(0) for t in (key_states, value_states))
        self.key_cache[layer_idx].index_copy_(0, write_index[0], k)
        self.value_cache[layer_idx].index_copy_(0, write_index[0], v)
        if read_index[0].numel() == 0:
            return k, v
        return (
            torch.index_select(c[layer_idx], 0, read_index[0]) for c in (self.key_cache, self.value_cache)
        )


def test_paged_steps_of_older_transformers_update_the_cache_and_run_on_fa4(fa4: Any) -> None:
    # transformers 5.17 calls a paged implementation with the step's new keys only and the
    # paged cache as `cache` (its own paged_attention_forward updates it): a prefill step
    # (nothing to read) then decode steps, each query attending to its sequence's whole
    # history, as plain causal attention of each sequence alone.
    from types import SimpleNamespace

    from fa4cache.adapters import transformers as fht

    rng = random.Random(SEED + 11)
    print(f"seed {SEED + 11}")
    hkv, g, D = 2, rng.choice([1, 2, 4]), 8
    lens = [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
    steps = 3
    cache = _PagedCacheBefore523(sum(lens) + steps * len(lens), hkv, D)
    free = list(range(sum(lens) + steps * len(lens)))
    rng.shuffle(free)  # pages anywhere in the cache
    slots: list[list[int]] = [[] for _ in lens]
    hist_k: list[list[Any]] = [[] for _ in lens]
    hist_v: list[list[Any]] = [[] for _ in lens]
    module = SimpleNamespace(layer_idx=0, is_causal=True)
    gen = torch.Generator().manual_seed(SEED + 11)
    for step in range(steps + 1):
        new = lens if step == 0 else [1] * len(lens)
        q = torch.randn(1, hkv * g, sum(new), D, generator=gen)
        k, v = (torch.randn(1, hkv, sum(new), D, generator=gen) for _ in range(2))
        write = []
        for i, n in enumerate(new):
            slots[i] += [free.pop() for _ in range(n)]
            write += slots[i][-n:]
        read = [] if step == 0 else [s for row in slots for s in row]
        cu_q = torch.tensor([0, *itertools.accumulate(new)], dtype=torch.int32)
        cu_k = torch.tensor([0, *itertools.accumulate(len(r) for r in slots)], dtype=torch.int32)
        out, _ = fht.attention_forward(
            module, q, k, v, None, scaling=D**-0.5, sliding_window=None,
            cache=cache, read_index=[torch.tensor(read, dtype=torch.long)],
            write_index=[torch.tensor(write, dtype=torch.long)], cu_seq_lens_q=cu_q,
            cu_seq_lens_k={"full_attention": cu_k} if step % 2 else cu_k,
            max_seqlen_q=max(new), max_seqlen_k=max(len(r) for r in slots),
        )  # fmt: skip
        for i, n in enumerate(new):
            a = int(cu_q[i])
            hist_k[i].append(k[0, :, a : a + n])
            hist_v[i].append(v[0, :, a : a + n])
            kk, vv = (torch.cat(h[i], 1).repeat_interleave(g, 0) for h in (hist_k, hist_v))
            s = torch.einsum("hqd,hkd->hqk", q[0, :, a : a + n], kk) * D**-0.5
            pos = torch.arange(n).view(-1, 1) + kk.shape[1] - n
            s = s.masked_fill(torch.arange(kk.shape[1]).view(1, -1) > pos, float("-inf"))
            want = torch.einsum("hqk,hkd->qhd", torch.softmax(s, -1), vv)
            torch.testing.assert_close(
                out[0, a : a + n], want, atol=1e-5, rtol=1e-5, msg=f"step {step} seq {i}"
            )
    assert all(kw.get("cu_seqlens_q") is not None for kw in fa4) and len(fa4) == steps + 1


def test_the_step_mask_is_checked_in_the_first_layer_of_each_kind(fa4: Any, monkeypatch: Any) -> None:
    """A step's key lengths (and the check of its mask) cost kernel launches: they are
    computed once per decode step and kind of layer (full, sliding), in the first layer of
    that kind, and shared by the others; a gap is still refused there."""
    from fa4cache.decode import key_ranges, step_ranges

    cfg = copy.deepcopy(_configs()["gemma2-softcap"])
    cfg.num_hidden_layers = 5
    cfg.layer_types = ["full_attention", "full_attention", "sliding_attention", "full_attention",
                       "sliding_attention"]  # fmt: skip
    model = _model(cfg, "fa4cache")
    checks: list[bool] = []
    real = key_ranges.key_ranges

    def spy(*a: Any, check: bool = True) -> Any:
        checks.append(check)
        return real(*a, check=check)

    monkeypatch.setattr(key_ranges, "key_ranges", spy)
    # Whatever earlier tests of this process left there: full, so that each new step evicts.
    for i in range(8):
        step_ranges._step[("earlier", i)] = (lambda: None, True, (None, None))
    rng = random.Random(SEED)
    ids, mask = _left_padded(rng, 3, 9, cfg.vocab_size)
    follow = torch.randint(0, cfg.vocab_size, (3, 2))
    _teacher_forced(model, ids, mask, follow, "dynamic")
    steps = len(checks) // 2
    assert steps >= 2 and checks == [True, True] * steps, checks
    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    mask[1, -3] = 0  # a gap
    with pytest.raises(RuntimeError, match="one run of tokens"), torch.no_grad():
        cache = _cache("dynamic", cfg, 16)
        model(input_ids=ids, attention_mask=mask[:, :-1], **{CACHE: cache})
        model(input_ids=follow[:, :1], attention_mask=mask, **{CACHE: cache})


@pytest.fixture
def one_row(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The one-row SDPA path where the tests run (FA4's device is the CPU here: its stand-in
    runs on it); counts that path's calls and the masks read back from the device."""
    from fa4cache.decode import one_row_sdpa

    monkeypatch.setattr(one_row_sdpa, "DEVICE_TYPES", ("cuda", "cpu"))
    seen = {"calls": 0, "reads": 0, "made": 0}
    real_forward, real_keep, real_made = (
        one_row_sdpa.forward,
        one_row_sdpa._keep,
        one_row_sdpa.mask_for_all_tokens,
    )

    def forward(*a: Any) -> Any:
        seen["calls"] += 1
        return real_forward(*a)

    def keep(mask: Any, ones: bool) -> bool:  # an answer kept: read from the device, or made
        seen["reads"] += 1
        return real_keep(mask, ones)

    def made(*a: Any) -> Any:
        mask = real_made(*a)
        seen["made"] += mask is not None
        seen["reads"] -= mask is not None
        return mask

    real_known = one_row_sdpa.not_all_ones

    def known(mask: Any) -> Any:  # an answer kept without a read (the hook's static slots)
        before = one_row_sdpa._known.get(id(mask))
        out = real_known(mask)
        seen["reads"] -= one_row_sdpa._known.get(id(mask)) is not before
        return out

    monkeypatch.setattr(one_row_sdpa, "forward", forward)
    monkeypatch.setattr(one_row_sdpa, "_keep", keep)
    monkeypatch.setattr(one_row_sdpa, "not_all_ones", known)
    monkeypatch.setattr(one_row_sdpa, "mask_for_all_tokens", made)
    return seen


@pytest.mark.parametrize("name", list(_configs()))
def test_one_row_decode_without_padding_runs_on_sdpa_in_its_full_layers(
    fa4: Any, one_row: dict[str, int], name: str
) -> None:
    # Batch 1, no padding, a dynamic cache: each step's mask is read once (one host sync, as
    # transformers' sdpa does), in the first layer that can use it, and its full layers run
    # SDPA's kernel; sliding and softcapped layers stay on FA4 and read nothing. Logits as
    # sdpa's on the same weights.
    seed = SEED + zlib.crc32(name.encode()) % 1000
    print(f"seed {seed}")
    rng = random.Random(seed)
    cfg = _configs()[name]
    m, ref = _model(cfg, "fa4cache"), _model(cfg, _reference(cfg))
    ids, mask = _left_padded(rng, 1, rng.randint(7, 12), cfg.vocab_size)
    steps = 6
    follow = torch.randint(0, cfg.vocab_size, (1, steps), generator=torch.Generator().manual_seed(seed))
    got = _teacher_forced(m, ids, mask, follow, "dynamic")
    want = _teacher_forced(ref, ids, mask, follow, "dynamic")
    for t, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda s, t=t: f"step {t}: {s}")
    on_fa4 = len([kw for kw in fa4 if kw["max_seqlen_q"] == 1])
    layers = cfg.num_hidden_layers
    assert one_row["calls"] + on_fa4 == layers * steps, (one_row, on_fa4)
    if name in ("llama-gqa", "qwen3"):  # full layers only
        assert (one_row["calls"], on_fa4, one_row["reads"]) == (layers * steps, 0, steps)
    else:  # Mistral: sliding layers only; Gemma 2: softcapping everywhere
        assert (one_row["calls"], one_row["reads"]) == (0, 0)


def test_one_row_generate_runs_on_sdpa_whether_transformers_keeps_the_mask_or_drops_it(
    fa4: Any, one_row: dict[str, int]
) -> None:
    # transformers 5.2x's generate drops an all-ones mask (the hook then gets None and makes
    # the step a mask of ones from the cache's sizes: no read); 5.17 keeps it (one read a step).
    cfg = _configs()["llama-gqa"]
    m, ref = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    ids = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(SEED))
    kw = {"attention_mask": torch.ones_like(ids), "max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False,
          "output_logits": True, "return_dict_in_generate": True, "pad_token_id": 0}  # fmt: skip
    with torch.no_grad():
        got, want = m.generate(ids, **kw), ref.generate(ids, **kw)
    assert torch.equal(got.sequences, want.sequences)
    for t, (a, b) in enumerate(zip(got.logits, want.logits)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda s, t=t: f"step {t}: {s}")
    steps = 5  # after the prefill
    assert one_row["calls"] == cfg.num_hidden_layers * steps, one_row
    assert (one_row["reads"], one_row["made"]) in ((0, steps), (steps, 0)), one_row
    assert not [kw for kw in fa4 if kw["max_seqlen_q"] == 1]


def test_one_row_decode_stays_on_fa4_with_padding_a_batch_a_static_cache_or_the_setting_off(
    fa4: Any, one_row: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _configs()["llama-gqa"]
    m, ref = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    rng = random.Random(SEED + 5)
    print(f"seed {SEED + 5}")
    steps = 4

    def run(ids: Any, mask: Any, kind: str = "dynamic") -> None:
        follow = torch.randint(
            0, cfg.vocab_size, (ids.shape[0], steps), generator=torch.Generator().manual_seed(1)
        )
        fa4.clear()
        got = _teacher_forced(m, ids, mask, follow, kind)
        want = _teacher_forced(ref, ids, mask, follow, kind)
        for t, (a, b) in enumerate(zip(got[1:], want[1:])):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda s, t=t: f"step {t}: {s}")
        assert one_row["calls"] == 0, one_row
        assert len([kw for kw in fa4 if kw["max_seqlen_q"] == 1]) == cfg.num_hidden_layers * steps

    ids, mask = _left_padded(rng, 1, 10, cfg.vocab_size)
    padded = mask.clone()
    padded[0, :3] = 0
    run(ids, padded)  # left padding in the one row
    run(*_left_padded(rng, 2, 10, cfg.vocab_size))  # two rows, the second padded
    run(torch.cat([ids, ids]), torch.ones(2, 10, dtype=torch.long))  # two rows, no padding
    run(ids, mask, "static")  # a static cache's mask is padded to its buffer
    with torch.inference_mode():
        run(ids, mask)  # inference tensors: no version to check the mask by
    set_switch(monkeypatch, "FA4CACHE_ONE_ROW_SDPA", "0")
    run(ids, mask)


def test_a_static_step_mask_the_hook_makes_is_not_read_back(fa4: Any, one_row: dict[str, int]) -> None:
    # The hook's masks over a static buffer have empty slots (made from the cache's sizes, or
    # transformers' mask padded to the buffer): known not to be all ones when made, a one-row
    # step read them back from the device (a host sync) to learn it.
    from fa4cache.adapters.transformers.masks import padding_mask
    from transformers.masking_utils import causal_mask_function

    from fa4cache.decode import one_row_sdpa

    made = padding_mask(1, 1, 11, torch.tensor(9), 0, causal_mask_function, None, device=torch.device("cpu"))
    padded = padding_mask(
        1, 1, 11, torch.tensor(9), 0, causal_mask_function, torch.ones(1, 10, dtype=torch.bool)
    )
    assert made.tolist() == [[True] * 10 + [False]] and padded.tolist() == [[True] * 10 + [False]]
    assert not one_row_sdpa.all_ones(made) and not one_row_sdpa.all_ones(padded)
    assert one_row["reads"] == 0, one_row
    full = padding_mask(1, 1, 10, 9, 0, causal_mask_function, torch.ones(1, 10, dtype=torch.bool))
    assert one_row_sdpa.all_ones(full) and one_row["reads"] == 1  # a mask it did not make: read once


def test_a_one_row_decode_step_compiles_into_one_graph(fa4: Any, one_row: dict[str, int]) -> None:
    # torch.compile of a decode step with the path enabled on the step's device: nothing of
    # it is traced (no graph break; fullgraph compiles), and the compiled step runs FA4's op.
    from transformers import DynamicCache

    cfg = _configs()["llama-gqa"]
    m = _model(cfg, "fa4cache")
    ids = torch.randint(0, cfg.vocab_size, (1, 10), generator=torch.Generator().manual_seed(SEED))
    torch._dynamo.reset()
    run = torch.compile(m, fullgraph=True, backend="eager")
    cache = DynamicCache(config=cfg)
    mask = torch.ones(1, 10, dtype=torch.long)
    with torch.no_grad():
        m(input_ids=ids, attention_mask=mask, **{CACHE: cache})
        mask = torch.cat([mask, mask[:, :1]], 1)
        out = run(
            input_ids=ids[:, :1], attention_mask=mask, position_ids=torch.tensor([[10]]), **{CACHE: cache}
        )
        # No mask (as transformers 5.2x's generate passes an all-ones one): the hook is traced too.
        run(input_ids=ids[:, 1:2], position_ids=torch.tensor([[11]]), **{CACHE: cache})
    assert out.logits.shape == (1, 1, cfg.vocab_size)
    decode = len([kw for kw in fa4 if kw["max_seqlen_q"] == 1])
    assert (one_row["calls"], one_row["made"], decode) == (0, 0, 2 * cfg.num_hidden_layers), (one_row, decode)


def test_a_mask_read_as_all_ones_is_not_trusted_after_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    # The answer is kept for the mask object as it was: a write to it in place (its version
    # moves), another mask never read, or a mask of two rows is read anew (or not at all).
    from fa4cache.decode import one_row_sdpa

    monkeypatch.setattr(one_row_sdpa, "DEVICE_TYPES", ("cpu",))
    mask = torch.ones(1, 9, dtype=torch.long)
    assert one_row_sdpa.all_ones(mask) and one_row_sdpa.all_ones(mask)
    mask[0, 0] = 0
    assert not one_row_sdpa.all_ones(mask)
    mask[0, 0] = 1
    assert one_row_sdpa.all_ones(mask)  # read again: ones again
    assert not one_row_sdpa.all_ones(torch.ones(2, 9, dtype=torch.bool))
    assert one_row_sdpa.all_ones(torch.ones(1, 3, dtype=torch.bool))
    monkeypatch.setattr(one_row_sdpa, "DEVICE_TYPES", ("cuda",))
    assert not one_row_sdpa.all_ones(torch.ones(1, 9, dtype=torch.long))  # CPU: FA4's device is CUDA


def test_a_step_given_no_mask_gets_the_slots_that_hold_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hook's answer to a cache step given no mask (5.2x's generate drops one without
    # padding). A one-row step over a dynamic cache (an int query offset, keys from slot 0, as
    # many as the tokens) gets ones known without a read (the one-row path); every other cache
    # step gets the slots that hold tokens (slot s holds position kv_offset + s; the tokens so
    # far are q_offset + q_length), so a step through PyTorch never sees a static buffer's
    # empty slots. A step without a cache gets none, as before.
    from fa4cache.adapters.transformers import padding_mask

    from fa4cache.decode import one_row_sdpa

    def known_ones(m: Any) -> bool:
        hit = one_row_sdpa._known.get(id(m))
        return hit is not None and hit[0]() is m and hit[2]

    monkeypatch.setattr(one_row_sdpa, "DEVICE_TYPES", ("cpu",))
    made = padding_mask(1, 1, 13, 12, 0, device="cpu")
    assert made is not None and made.shape == (1, 13) and bool(made.all()) and known_ones(made)
    for args, kw, tokens in [
        ((1, 1, 13, torch.tensor(12), 0), {}, 13),  # a static cache's offset (a tensor: no sync)
        ((1, 1, 9, 20, 12), {}, 9),  # a sliding cache's keys start at slot 12: all tokens
        ((1, 1, 13, 12, 0), {"local_size": 8}, 13),  # a sliding layer's mask
        ((2, 1, 13, 12, 0), {}, 13),  # two rows
        ((1, 3, 15, 12, 0), {}, 15),  # three queries
        ((1, 1, 40, 12, 0), {}, 13),  # a static buffer: 13 tokens, 27 empty slots
        ((2, 4, 40, 0, 0), {}, 4),  # a prefill into one
    ]:
        m = padding_mask(*args, device="cpu", **kw)
        assert m.shape == (args[0], args[2]) and m.dtype == torch.bool, (args, kw)
        assert m.sum(1).tolist() == [tokens] * args[0] and bool(m[:, :tokens].all()), (args, kw, m)
        assert not known_ones(m), (args, kw)
    assert padding_mask(1, 1, 1, 0, 0, device="cpu") is None  # nothing cached yet
    assert padding_mask(2, 12, 12, 0, 0, device="cpu") is None  # no cache: documents from position_ids
    from transformers.masking_utils import bidirectional_mask_function

    # Cross-attention (a bidirectional rule): the encoder's keys are no cache.
    assert padding_mask(1, 1, 12, 3, 0, mask_function=bidirectional_mask_function, device="cpu") is None
    set_switch(monkeypatch, "FA4CACHE_ONE_ROW_SDPA", "0")
    assert not known_ones(padding_mask(1, 1, 13, 12, 0, device="cpu"))
    monkeypatch.setattr(one_row_sdpa, "DEVICE_TYPES", ("cuda",))
    set_switch(monkeypatch, "FA4CACHE_ONE_ROW_SDPA", None)
    assert not known_ones(padding_mask(1, 1, 13, 12, 0, device="cpu"))  # not FA4's device


@pytest.mark.parametrize("extra", ["sinks", "bias"])
def test_attention_sinks_and_a_position_bias_run_through_pytorch_as_transformers_eager(
    fa4: Any, caplog: Any, extra: str
) -> None:
    # gpt-oss passes its sinks (s_aux) and T5 its relative position bias: FA4's calls here apply
    # neither, so such steps run through PyTorch (one warning), prefill and decode, with the
    # logits of transformers' own implementation; continuous batching is refused by name.
    from types import SimpleNamespace

    from fa4cache.adapters import transformers as fht
    from transformers import GptOssConfig, T5Config, T5ForConditionalGeneration

    if extra == "sinks":
        cfg = GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                           num_experts_per_tok=2, sliding_window=64,
                           layer_types=["full_attention", "sliding_attention"])  # fmt: skip
        m, ref = _model(cfg, "fa4cache"), _model(cfg, "eager")
        with torch.no_grad():
            for model in (m, ref):
                for n, p in model.named_parameters():
                    if "sinks" in n:
                        p.copy_(torch.linspace(-2, 2, p.numel()).view_as(p))
        rng = random.Random(SEED + 9)
        ids, mask = _left_padded(rng, 2, 9, cfg.vocab_size)
        follow = torch.randint(0, cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(SEED))
        with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
            got = _teacher_forced(m, ids, mask, follow, "dynamic")
        want = _teacher_forced(ref, ids, mask, follow, "dynamic")
        valid = mask.bool()
        torch.testing.assert_close(got[0][valid], want[0][valid], atol=2e-5, rtol=2e-5)
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
        assert [r for r in caplog.records if "attention sinks (s_aux) runs through PyTorch" in r.getMessage()]
        q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 9, 16)  # new tokens against gathered keys
        with pytest.raises(ValueError, match="attention sinks.*attn_implementation='eager'"):
            fht.attention_forward(
                SimpleNamespace(layer_idx=0, is_causal=True), q, k, k, None,
                cu_seq_lens_q=torch.tensor([0, 1, 3], dtype=torch.int32),
                cu_seq_lens_k=torch.tensor([0, 5, 9], dtype=torch.int32), max_length_q=2, max_length_k=5,
                s_aux=torch.zeros(4),
            )  # fmt: skip
        return
    cfg = T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   decoder_start_token_id=0)  # fmt: skip

    def run(impl: str) -> Any:
        torch.manual_seed(0)
        t5 = T5ForConditionalGeneration._from_config(copy.deepcopy(cfg), attn_implementation=impl).eval()
        enc = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            return t5.generate(enc, attention_mask=torch.ones_like(enc), max_new_tokens=5, min_new_tokens=5,
                               do_sample=False, output_logits=True, return_dict_in_generate=True)  # fmt: skip

    got, want = run("fa4cache"), run("sdpa")
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


def test_per_query_sinks_apply_and_sparse_indices_are_refused_by_name(fa4: Any) -> None:
    # Inkling 2 passes one sink logit per head and query ([B, H, S, 1]): applied in the
    # softmax, then dropped (a hand reference, prefill with padding and a cache step).
    # DeepSeek V3.2's top-k `indices` and MiniMax's `block_indices` say which keys each query
    # attends: fa4cache applies neither, so it refuses them rather than attend every key.
    from types import SimpleNamespace

    from fa4cache.adapters import transformers as fht

    gen = torch.Generator().manual_seed(SEED + 13)
    print(f"seed {SEED + 13}")
    layer = SimpleNamespace(layer_idx=0, is_causal=True)
    B, H, Hkv, D = 2, 4, 2, 8
    for Tq, Tk in ((6, 6), (1, 9)):
        q = torch.randn(B, H, Tq, D, generator=gen)
        k, v = (torch.randn(B, Hkv, Tk, D, generator=gen) for _ in range(2))
        sinks = torch.randn(B, H, Tq, 1, generator=gen)
        mask = torch.ones(B, Tk, dtype=torch.long)
        mask[1, :2] = 0
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -Tq:]
        out, _ = fht.attention_forward(layer, q, k, v, mask, scaling=D**-0.5, sinks=sinks, position_ids=pos)
        kk, vv = (t.repeat_interleave(H // Hkv, 1) for t in (k, v))
        scores = q @ kk.transpose(2, 3) * D**-0.5
        i = torch.arange(Tq).view(Tq, 1) + Tk - Tq
        allowed = (torch.arange(Tk).view(1, Tk) <= i) & mask.bool().view(B, 1, 1, Tk)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(torch.cat([scores, sinks], -1), -1)[..., :-1]
        want = (probs @ vv).transpose(1, 2)
        rows = mask[:, -Tq:].bool()  # a padding query's output is whatever the path gives it
        torch.testing.assert_close(
            out[rows], want[rows], atol=1e-5, rtol=1e-5, msg=lambda m, t=Tq: f"Tq {t}: {m}"
        )
    q = torch.randn(1, H, 3, D, generator=gen)
    for name in ("indices", "block_indices"):
        with pytest.raises(ValueError, match=f"`{name}`.*attn_implementation='sdpa' or 'eager'"):
            fht.attention_forward(layer, q, q, q, None, position_ids=torch.arange(3)[None],
                                  **{name: torch.zeros(1, 3, 2, dtype=torch.int32)})  # fmt: skip


def test_paged_decode_with_a_block_table_writes_the_new_keys_and_runs_on_fa4(fa4: Any) -> None:
    # transformers 5.2x's paged decode (as for flash_attn_with_kvcache): the cache has not
    # stored the step's token; block_table, k_cache/v_cache [pages, page, Hkv, D] and
    # cu_seq_lens_k (the new token included) come in kwargs. The call writes the token into
    # its page and attends over each sequence's pages, as plain causal attention.
    from types import SimpleNamespace

    from fa4cache.adapters import transformers as fht

    rng = random.Random(SEED + 12)
    hkv, g, D, page, n = 2, 2, 8, 4, 3
    lens = [rng.randint(1, 9) for _ in range(n)]  # keys already cached
    pages = 16
    kc, vc = torch.zeros(pages, page, hkv, D), torch.zeros(pages, page, hkv, D)
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(SEED)).tolist()
    table = torch.zeros(n, 4, dtype=torch.int32)
    hist_k, hist_v = [], []
    for i, L in enumerate(lens):
        for c in range(4):
            table[i, c] = order.pop()
        k_i, v_i = torch.randn(L, hkv, D), torch.randn(L, hkv, D)
        for t in range(L):
            kc[table[i, t // page], t % page], vc[table[i, t // page], t % page] = k_i[t], v_i[t]
        hist_k.append(k_i)
        hist_v.append(v_i)
    q = torch.randn(1, hkv * g, n, D)
    k, v = torch.randn(1, hkv, n, D), torch.randn(1, hkv, n, D)
    cu_k = torch.tensor([0, *itertools.accumulate(x + 1 for x in lens)], dtype=torch.int32)
    cu_q = torch.arange(n + 1, dtype=torch.int32)
    out, _ = fht.attention_forward(
        SimpleNamespace(layer_idx=0, is_causal=True), q, k, v, None, scaling=D**-0.5,
        cu_seq_lens_q=cu_q, cu_seq_lens_k={"full_attention": cu_k}, max_length_q=1, max_length_k=1,
        block_table=table, k_cache=kc, v_cache=vc,
    )  # fmt: skip
    assert out.shape == (1, n, hkv * g, D)
    for i, L in enumerate(lens):
        assert torch.equal(kc[table[i, L // page], L % page], k[0, :, i])  # the kernel's write
        kk = torch.cat([hist_k[i], k[0, :, i][None]]).repeat_interleave(g, 1)
        vv = torch.cat([hist_v[i], v[0, :, i][None]]).repeat_interleave(g, 1)
        p = torch.softmax(torch.einsum("hd,khd->hk", q[0, :, i], kk) * D**-0.5, -1)
        torch.testing.assert_close(out[0, i], torch.einsum("hk,khd->hd", p, vv), atol=1e-5, rtol=1e-5)
    assert all(kw.get("page_table") is not None for kw in fa4) and len(fa4) == 1


def test_decoding_under_inference_mode_matches_no_grad(fa4: Any) -> None:
    # Inference tensors carry no version counter: what is shared between layers (the step's
    # mask and key ranges) is then not kept, rather than read from a counter that is not there.
    cfg = _configs()["llama-gqa"]
    m = _model(cfg, "fa4cache")
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    ids, mask = _left_padded(rng, 3, 9, cfg.vocab_size)
    follow = torch.randint(0, cfg.vocab_size, (3, 4), generator=torch.Generator().manual_seed(SEED))
    want = _teacher_forced(m, ids, mask, follow, "dynamic")
    with torch.inference_mode():
        got = _teacher_forced(m, ids, mask, follow, "dynamic")
    for t, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=lambda s, t=t: f"step {t}: {s}")


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_a_right_padded_prefill_over_a_cache_is_refused(fa4: Any, kind: str) -> None:
    # Over a cache (a static buffer; a dynamic cache's second chunk) a prefill's queries are
    # aligned to each row's last token: with right padding the real tokens attended as if
    # shifted (silently, on FA4 and in the fallback). Now refused on the device by name.
    from transformers import DynamicCache

    cfg = _configs()["llama-gqa"]
    m, ref = _model(cfg, "fa4cache"), _model(cfg, "eager")
    ids = torch.randint(1, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(SEED + 51))
    right = torch.ones(2, 8, dtype=torch.long)
    right[1, 6:] = 0
    left = right.flip(1)

    def run(model: Any, mask: Any) -> Any:
        cache = _cache(kind, cfg, 16) if kind == "static" else DynamicCache(config=cfg)
        if kind == "dynamic":  # a first chunk of two tokens, then the rest over the cache
            model(input_ids=ids[:, :2], attention_mask=mask[:, :2], **{CACHE: cache})
            return model(input_ids=ids[:, 2:], attention_mask=mask, **{CACHE: cache}).logits
        return model(input_ids=ids, attention_mask=mask, **{CACHE: cache}).logits

    with torch.no_grad():
        with pytest.raises(RuntimeError, match="right padding.*padding_side='left'"):
            run(m, right)
        got, want = run(m, left), run(ref, left)
        keep = left[:, -got.shape[1] :].bool()
        torch.testing.assert_close(got[keep], want[keep], atol=2e-5, rtol=2e-5)
        # A row still all padding when a chunk ends (its tokens start in a later chunk) is
        # left padding, not right: never refused, in chunks of 2, 3 or 5 tokens.
        long_left = torch.ones(2, 8, dtype=torch.long)
        long_left[1, :6] = 0
        for first in (2, 3, 5):
            cache = DynamicCache(config=cfg) if kind == "dynamic" else _cache(kind, cfg, 16)
            for a, b in ((0, first), (first, 8)):
                m(input_ids=ids[:, a:b], attention_mask=long_left[:, :b], **{CACHE: cache})
        with torch.inference_mode():  # one row over a static buffer: its masks are inference tensors
            m(input_ids=ids[:1], attention_mask=left[:1], **{CACHE: _cache("static", cfg, 16)})


@pytest.mark.parametrize("family", ["gpt_oss", "t5"])
def test_steps_through_pytorch_over_a_static_cache_see_only_the_tokens(fa4: Any, family: str) -> None:
    # A step that runs through PyTorch (gpt-oss's sinks, T5's position bias) over a static
    # buffer once aligned its queries to the buffer's end: they saw the empty slots, and a
    # prefill its future tokens (gpt-oss 0.28-0.69 off, T5 5.2 off, different tokens).
    # transformers 5.2x's generate passes no mask without padding: the hook makes one.
    from transformers import GptOssConfig, GptOssForCausalLM, T5Config, T5ForConditionalGeneration

    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, output_logits=True,
              return_dict_in_generate=True, cache_implementation="static")  # fmt: skip
    if family == "t5":
        cfg, cls = T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                            num_heads=4, decoder_start_token_id=0), T5ForConditionalGeneration  # fmt: skip
    else:
        cfg = GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                           num_experts_per_tok=2, sliding_window=4, pad_token_id=0,
                           layer_types=["sliding_attention", "full_attention"])  # fmt: skip
        cls = GptOssForCausalLM
    models = []
    for impl in ("fa4cache", "eager"):
        torch.manual_seed(0)
        models.append(cls._from_config(copy.deepcopy(cfg), attn_implementation=impl).eval())
    rng = random.Random(SEED + 21)
    print(f"seed {SEED + 21}")
    for batch in (1, 2):
        ids, mask = _left_padded(rng, batch, 10, cfg.vocab_size)
        for m in (mask, None) if batch == 1 else (mask,):
            with torch.no_grad():
                got, want = (model.generate(input_ids=ids, attention_mask=m, **kw) for model in models)
            assert torch.equal(got.sequences, want.sequences), (batch, m)
            torch.testing.assert_close(
                torch.stack(got.logits), torch.stack(want.logits), atol=2e-5, rtol=2e-5
            )


def test_a_compiled_static_step_given_no_mask_sees_only_the_tokens(fa4: Any) -> None:
    # A static buffer's decode step without a mask (5.2x's generate drops one without
    # padding), traced whole: the hook's mask of the slots that hold tokens is built inside
    # the graph (a tensor offset, no sync), and the step equals eager's.
    cfg = _configs()["llama-gqa"]
    m, ref = _model(cfg, "fa4cache"), _model(cfg, "eager")
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(SEED + 31))
    print(f"seed {SEED + 31}")
    caches = [_cache("static", cfg, 24) for _ in range(2)]
    torch._dynamo.reset()
    run = torch.compile(m, fullgraph=True, backend="eager")
    with torch.no_grad():
        for model, cache in zip((m, ref), caches):
            model(input_ids=ids[:, :10], **{CACHE: cache})
        for t in (10, 11):
            pos = torch.tensor([t])
            got = run(input_ids=ids[:, t : t + 1], cache_position=pos, **{CACHE: caches[0]}).logits
            want = ref(input_ids=ids[:, t : t + 1], cache_position=pos, **{CACHE: caches[1]}).logits
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
