"""transformers adapter on the CPU: real models (random weights, from configs), real masks.

FA4 cannot run without a GPU, so the model-level tests swap ``fa4cache.attention`` for a
float reference that applies the mask's boolean matrix (the same matrix the GPU fuzz test
holds FA4 to); everything else (transformers' model code, its mask plumbing, kwargs,
caches, fa4cache's document masks and the adapter) is real. The FA4 kernels themselves are
cross-compiled for real through the adapter under FakeTensorMode.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import subprocess
import sys
import zlib
from typing import Any

import pytest

from tests.conftest import ROOT, worker_env

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture
def adapter(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    from fa4cache.adapters import transformers as fht

    import fa4cache
    from fa4cache.ops import attention as attention_mod
    from fa4cache.ops import step_mask, varlen_calls
    from tests.helpers import fa4_varlen_model

    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path / "store"))
    fht.register()
    calls = {"masks": 0}
    real_build = step_mask._build

    def counting_build(*args: Any) -> Any:
        calls["masks"] += 1
        return real_build(*args)

    monkeypatch.setattr(step_mask, "_build", counting_build)
    # The packed path's FA4 varlen calls, modelled in float (the calls themselves are real).
    monkeypatch.setattr(varlen_calls, "forward", fa4_varlen_model.forward)
    monkeypatch.setattr(varlen_calls, "backward", fa4_varlen_model.backward)
    from fa4cache.decode import launch

    monkeypatch.setattr(launch, "_fa4_forward", lambda *a, **kw: fa4_varlen_model.flash_attn_fwd(*a, **kw)[0])
    # fa4cache.attention first: its lazy lookup would otherwise resolve to (and on undo
    # restore) the already-patched adapter function, leaking the reference to later tests.
    monkeypatch.setattr(fa4cache, "attention", fa4_varlen_model.mask_reference, raising=False)
    monkeypatch.setattr(attention_mod, "attention", fa4_varlen_model.mask_reference)
    step_mask._cache.clear()
    yield fht, calls


def _configs() -> dict[str, Any]:
    from transformers import LlamaConfig, MistralConfig, Qwen3Config

    small = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3}
    return {
        "llama-mha": LlamaConfig(**small, num_attention_heads=4, num_key_value_heads=4),
        "llama-gqa": LlamaConfig(**small, num_attention_heads=8, num_key_value_heads=2, head_dim=16),
        "qwen3": Qwen3Config(**small, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        "mistral-sliding": MistralConfig(
            **small, num_attention_heads=4, num_key_value_heads=2, sliding_window=7
        ),
    }


def _model(cfg: Any, impl: str) -> Any:
    import copy

    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)  # the same weights for every implementation
    model = AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.float32
    )
    assert model.config._attn_implementation == impl
    return model.eval()


def _packing(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([1, 2, 5, 9, 16, 23]) for _ in range(rng.randint(2, 6))]


def _packed_and_alone(packed_model: Any, ref_model: Any, lens: list[int]) -> tuple[Any, list[int], Any, Any]:
    """``(ids, offsets, packed, alone)``: logits of one row of documents of ``lens`` tokens
    packed through ``packed_model`` (``position_ids`` restarting per document), and of each
    document run alone through ``ref_model``."""
    ids = torch.randint(0, packed_model.config.vocab_size, (1, sum(lens)))
    pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1)
    cu = [0, *itertools.accumulate(lens)]
    with torch.no_grad():
        packed = packed_model(input_ids=ids, position_ids=pos).logits[0]
        alone = torch.cat([ref_model(input_ids=ids[:, a:b]).logits[0] for a, b in zip(cu[:-1], cu[1:])])
    return ids, cu, packed, alone


@pytest.mark.parametrize("name", list(_configs()))
@pytest.mark.parametrize("form", ["position_ids", "cu_seq_lens", "cu_seqlens"])
def test_packed_batch_matches_each_document_alone(adapter: Any, name: str, form: str) -> None:
    fht, calls = adapter
    cfg = _configs()[name]
    packed_model = _model(cfg, "fa4cache")
    sdpa_model = _model(cfg, "sdpa")
    lens = _packing(hash((name, form)) % 1000)
    ids = torch.randint(0, cfg.vocab_size, (1, sum(lens)))
    pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    kw: dict[str, Any] = {"position_ids": pos}
    if form == "cu_seq_lens":
        kw |= {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lens), "max_length_k": max(lens)}
    elif form == "cu_seqlens":  # continuous batching's naming
        kw |= {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": max(lens), "max_seqlen_k": max(lens)}
    with torch.no_grad():
        packed = packed_model(input_ids=ids, **kw).logits[0]
        alone = torch.cat(
            [sdpa_model(input_ids=ids[:, a:b]).logits[0] for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
        )
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=2e-5)
    # One mask per forward step, shared by every layer.
    assert calls["masks"] == 1, calls


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "form"),
    [("qwen3", "position_ids"), ("qwen3", "cu_seq_lens"), ("mistral-sliding", "position_ids")],
)
def test_a_compiled_model_trains_like_the_eager_one(adapter: Any, name: str, form: str) -> None:
    # torch.compile sees the attention as one custom op: the whole model is one graph
    # (fullgraph=True raises on any graph break), and loss and gradients match the eager
    # model. New packings recompile nothing, a new longest document (max_length_q) included.
    # aot_eager: the graph capture and autograd of torch.compile, without a C++ toolchain.
    fht, calls = adapter
    cfg = _configs()[name]
    eager, compiled = _model(cfg, "fa4cache").train(), _model(cfg, "fa4cache").train()
    run = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    from torch._dynamo import config as dynamo_config

    rng = random.Random(7)
    for step in range(3):
        cuts = sorted(rng.sample(range(1, 40), 4))  # 5 documents of new lengths, 40 tokens
        lens = [b - a for a, b in zip([0, *cuts], [*cuts, 40])]
        ids = torch.randint(0, cfg.vocab_size, (1, 40))
        pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1)
        outs = []
        for model, fn in ((eager, eager), (compiled, run)):
            model.zero_grad()
            # Its own tensors: the step-mask cache would otherwise serve both models.
            kw: dict[str, Any] = {"position_ids": pos.clone()}
            if form == "cu_seq_lens":
                cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
                kw |= {
                    "cu_seq_lens_q": cu,
                    "cu_seq_lens_k": cu.clone(),
                    "max_length_q": max(lens),
                    "max_length_k": max(lens),
                }
            with dynamo_config.patch(error_on_recompile=step > 0):
                loss = fn(input_ids=ids, labels=ids, **kw).loss
            loss.backward()
            outs.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
        for a, b in zip(outs[0][1], outs[1][1]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert calls["masks"] == 6, calls  # one per step and model, shared by the backward


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_packed_gradients_match_each_document_alone(adapter: Any, batch: int) -> None:
    # The backward through the custom op (GQA: dK/dV summed over the group; batch 2: the
    # flattened copies): parameter gradients of a packed step equal the sum over each
    # document run alone through SDPA.
    cfg = _configs()["llama-gqa"]
    packed_model, sdpa_model = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    rows = [_packing(10 + b) for b in range(batch)]
    T = max(sum(r) for r in rows)
    rows = [r + ([T - sum(r)] if sum(r) < T else []) for r in rows]
    ids = torch.randint(0, cfg.vocab_size, (batch, T))
    pos = torch.stack([torch.cat([torch.arange(n) for n in r]) for r in rows])
    weight = torch.randn(batch, T, cfg.vocab_size)
    (packed_model(input_ids=ids, position_ids=pos).logits * weight).sum().backward()
    for b, r in enumerate(rows):
        a = 0
        for n in r:
            out = sdpa_model(input_ids=ids[b : b + 1, a : a + n]).logits
            (out * weight[b : b + 1, a : a + n]).sum().backward()
            a += n
    for (name, p), q in zip(packed_model.named_parameters(), sdpa_model.parameters()):
        torch.testing.assert_close(
            p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_padding_masks_keep_text_away_from_padding(adapter: Any) -> None:
    cfg = _configs()["llama-gqa"]
    m = _model(cfg, "fa4cache")
    ref = _model(cfg, "sdpa")
    ids = torch.randint(0, cfg.vocab_size, (2, 12))
    att = torch.ones(2, 12, dtype=torch.long)
    att[0, 9:] = 0  # right padding
    with torch.no_grad():
        got = m(input_ids=ids, attention_mask=att).logits
        want = ref(input_ids=ids, attention_mask=att).logits
    torch.testing.assert_close(got[0, :9], want[0, :9], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got[1], want[1], atol=2e-5, rtol=2e-5)


def test_sliding_window_maps_to_the_masks_window(adapter: Any) -> None:
    from fa4cache.ops import step_mask

    cfg = _configs()["mistral-sliding"]  # sliding_window=7
    with torch.no_grad():
        _model(cfg, "fa4cache")(
            input_ids=torch.zeros(1, 30, dtype=torch.long), position_ids=torch.arange(30).view(1, -1)
        )
    (m,) = [mask for _, mask in step_mask._cache.values()]
    dense = m.dense()[0]
    # transformers' window of 7 keys: the query and the 6 before it.
    assert dense[20].nonzero().view(-1).tolist() == list(range(14, 21))
    assert m.varlen.window_size == (6, 0)


def test_generation_with_a_cache_runs_without_a_fallback(adapter: Any, caplog: Any) -> None:
    # Decoding runs on FA4's KV-cache path (tests/adapters/transformers/test_generation.py holds it to SDPA).
    cfg = _configs()["qwen3"]
    m = _model(cfg, "fa4cache")
    ref = _model(cfg, "sdpa")
    ids = torch.randint(0, cfg.vocab_size, (1, 9))
    with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        out = m.generate(ids, max_new_tokens=6, do_sample=False)
    want = ref.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, want)
    assert not [r for r in caplog.records if "runs through PyTorch" in r.getMessage()]


def test_a_fa4cache_mask_in_the_forward_kwargs_is_used_by_every_layer(
    adapter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fa4cache.masks import make_document_mask

    cfg = _configs()["llama-mha"]
    m = _model(cfg, "fa4cache")
    ids = torch.randint(0, cfg.vocab_size, (1, 20))
    prefix = make_document_mask(torch.tensor([0, 12, 20]), prefix_lengths=torch.tensor([5, 3]))
    seen = []
    from fa4cache.ops import attention as attention_mod

    real = attention_mod.attention

    def spy(q: Any, k: Any, v: Any, mask: Any, **kw: Any) -> Any:
        seen.append(mask)
        return real(q, k, v, mask, **kw)

    import fa4cache

    monkeypatch.setattr(fa4cache, "attention", spy)  # the adapter calls fa4cache.attention
    with torch.no_grad():
        m(input_ids=ids, fa4cache_mask=prefix)
    assert len(seen) == cfg.num_hidden_layers and all(s is prefix for s in seen)


def test_registration_names_and_flash_attention_4_fix(adapter: Any) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert "fa4cache" in AttentionInterface._global_mapping
    assert "fa4cache" in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    import flash_attn.cute as fa

    assert getattr(fa.flash_attn_varlen_func, "__fa4cache_max_seqlen_fix__", False)
    import inspect

    assert "max_seqlen_q" in inspect.signature(fa.flash_attn_varlen_func).parameters


COMPILE = r"""
import os, sys
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90"); os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
import fa4cache
from fa4cache.ops import packed_attention, step_mask
from fa4cache.adapters import transformers as fht
from fa4cache.adapters.compile.warm_specs import fake_copy

SOFTCAP = float(os.environ.get("FA4CACHE_TEST_SOFTCAP", "0")) or None
fht.register(max_documents=16)
store = fa4cache.install()

class Attn:  # what transformers hands the attention function
    is_causal = True

# Under FakeTensorMode the custom op would run only its shape function: call its body.
packed_attention.op = lambda: packed_attention.forward

def step(lens, window):
    T = sum(lens)
    pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1)
    # The step's mask from real CPU position_ids (masks are built before faking), then
    # the adapter's own call into the op's body and FA4, on fake CUDA tensors.
    mask = step_mask.step_mask(batch=1, seqlen=T, causal=True, window=window, position_ids=pos)
    with FakeTensorMode(), torch.no_grad():
        fake = fake_copy(mask)
        packed_attention.step_mask = lambda **kw: fake
        q = torch.empty(1, 8, T, 64, dtype=torch.bfloat16, device="cuda")
        kv = torch.empty(1, 2, T, 64, dtype=torch.bfloat16, device="cuda")
        out, _ = fht.attention_forward(
            Attn(), q, kv, kv, None, scaling=0.125, sliding_window=None if window is None else window + 1,
            softcap=SOFTCAP, position_ids=pos,
        )
        assert tuple(out.shape) == (1, T, 8, 64)

for lens in ([100, 200], [17, 1, 300, 5], [640]):
    for window in (None, 63):
        step(lens, window)
store.counters.flush()
print("RESULT", int(store.counters.values["compiles"]), int(store.counters.values["disk_hits"]))
"""


@pytest.mark.compile
def test_fa4_kernels_compile_through_the_adapter_once(tmp_path: Any) -> None:
    # Real FA4 forward kernels, cross-compiled for sm_90 through attention_forward: new
    # lengths compile nothing; a second process loads them all.
    def run() -> list[int]:
        p = subprocess.run(
            [sys.executable, "-c", COMPILE], cwd=ROOT, env=worker_env(tmp_path / "store"),
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        return [int(x) for x in p.stdout.split("RESULT", 1)[1].split()]

    compiles, hits = run()
    assert compiles >= 2 and hits == 0  # causal and causal+window forward kernel sets
    again, hits = run()
    assert again == 0 and hits == compiles


def test_the_step_mask_follows_its_source_tensor(adapter: Any) -> None:
    # One mask per step: any tensor over the same memory, layout and version (what a layer
    # or the compiled backward sees) gets the same mask; a batch written into the same
    # buffer (CUDA-graph staging) gets a new one with the new documents.
    from fa4cache.ops.step_mask import step_mask

    _, calls = adapter
    pos = torch.cat([torch.arange(n) for n in (3, 5, 4)]).view(1, -1)
    kw = {"batch": 1, "seqlen": 12, "causal": True, "window": None}
    first = step_mask(position_ids=pos, **kw)
    assert step_mask(position_ids=pos.view(1, 12), **kw) is first
    assert calls["masks"] == 1
    pos.copy_(torch.cat([torch.arange(n) for n in (6, 6)]).view(1, -1))
    second = step_mask(position_ids=pos, **kw)
    assert second is not first and calls["masks"] == 2
    want = torch.zeros(12, 12, dtype=torch.bool)
    want[:6, :6] = want[6:, 6:] = True
    assert torch.equal(second.dense()[0], want.tril())
    assert step_mask(position_ids=pos.clone(), **kw) is not second  # other memory: built again


@pytest.mark.compile
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_warm_from_a_model_config_covers_what_the_adapter_compiles(tmp_path: Any, softcap: Any) -> None:
    # `fa4cache warm --hf-config` reads only config.json: afterwards the adapter's own
    # calls (full and sliding layers, new lengths) compile nothing and load every kernel;
    # with Gemma 2's attn_logit_softcapping, the kernels with that cap (the softcapped
    # backward is cross-compiled too: "0 failed").
    import json

    from tests.conftest import run_cli

    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    cfg = {
        "model_type": "qwen3", "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "hidden_size": 256, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"],
        "dtype": "bfloat16",
    }  # fmt: skip
    if softcap is not None:
        cfg.update(model_type="gemma2", attn_logit_softcapping=softcap)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    w = run_cli(store, "warm", "--hf-config", str(tmp_path), *(["--no-backward"] if softcap is None else []))
    assert w.returncode == 0, w.stderr[-3000:]
    assert "2 specs" in w.stdout and "0 failed" in w.stdout, w.stdout
    env = {**worker_env(store), "FA4CACHE_TEST_SOFTCAP": str(softcap or 0)}
    p = subprocess.run(
        [sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stderr[-3000:]
    compiles, hits = (int(x) for x in p.stdout.split("RESULT", 1)[1].split())
    assert compiles == 0 and hits >= 2, (compiles, hits)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-gqa", "qwen3", "mistral-sliding"])
def test_unpacked_batches_match_sdpa(adapter: Any, name: str) -> None:
    # A plain batch (no packing, no mask): each row is one document.
    cfg = _configs()[name]
    ids = torch.randint(0, cfg.vocab_size, (2, 20))
    with torch.no_grad():
        got = _model(cfg, "fa4cache")(input_ids=ids).logits
        want = _model(cfg, "sdpa")(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.slow
def test_softcapped_packed_batch_takes_the_fa4_path_and_keeps_documents_apart(
    adapter: Any, caplog: Any
) -> None:
    # Gemma 2 softcaps attention logits: the packed path hands the cap to FA4's varlen calls
    # (modelled here; the GPU test runs FA4) with no fallback, keeps packed documents apart
    # and caps as transformers' eager path does.
    from transformers import Gemma2Config

    cfg = Gemma2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=6, attn_logit_softcapping=3.0,
        query_pre_attn_scalar=16,
    )  # fmt: skip
    import copy

    uncapped_cfg = copy.deepcopy(cfg)
    uncapped_cfg.attn_logit_softcapping = None
    models = [_model(c, impl) for c, impl in ((cfg, "fa4cache"), (cfg, "eager"), (uncapped_cfg, "eager"))]
    for m in models:  # logits large enough for the cap to bite (random init gives tiny ones)
        for name, w in m.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                w.data *= 40
    packed_model, eager_model, uncapped_model = models
    with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        ids, cu, packed, alone = _packed_and_alone(packed_model, eager_model, [5, 11, 1, 8])
    with torch.no_grad():
        uncapped = uncapped_model(input_ids=ids[:, cu[1] : cu[2]]).logits[0]
    torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)
    # Without the cap the logits differ: the comparison above can see a missing softcap.
    assert not torch.allclose(uncapped, alone[cu[1] : cu[2]], atol=1e-2)
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # no fallback


def test_dropout_fallback_keeps_documents_apart(adapter: Any) -> None:
    # With attention dropout the fallback drops probabilities; a document's output must still
    # not depend on another document's tokens (the seed fixes the dropout pattern).
    from fa4cache.adapters import transformers as fht

    torch.manual_seed(0)
    B, T, H, D = 1, 12, 2, 8
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    module = type("M", (), {"is_causal": True})()

    def run(kk: Any, vv: Any) -> Any:
        torch.manual_seed(1)
        return fht.attention_forward(module, q, kk, vv, None, dropout=0.3, position_ids=pos)[0]

    out = run(k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :5] += 5.0  # change only the first document's keys and values
    v2[:, :, :5] -= 3.0
    out2 = run(k2, v2)
    assert torch.equal(out[:, 5:], out2[:, 5:]), "the second document saw the first one"
    assert not torch.equal(out[:, :5], out2[:, :5])


def test_a_float_4d_mask_is_added_to_the_scores_as_transformers_does(adapter: Any, caplog: Any) -> None:
    # transformers' float masks are additive: 0 or the dtype's min, or a bias outright
    # (Parakeet passes its relative-position scores as the "mask"). The fallback once read a
    # float mask as "allowed where 0": Parakeet's encoder was 3.1 off eager's output.
    import copy

    from transformers import ParakeetEncoder, ParakeetEncoderConfig

    cfg = ParakeetEncoderConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    x = torch.randn(2, 64, cfg.num_mel_bins, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 40:] = 0

    def run(impl: str) -> Any:
        torch.manual_seed(0)
        m = ParakeetEncoder._from_config(copy.deepcopy(cfg), attn_implementation=impl).eval()
        with torch.no_grad():
            return m(input_features=x, attention_mask=mask).last_hidden_state

    from fa4cache.adapters import transformers as fht

    fht._warned.clear()  # the warning is once per process
    with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        got = run("fa4cache")
    # (transformers 5.17's eager Parakeet gives NaN rows for this padding: the same NaN here.)
    torch.testing.assert_close(got, run("eager"), atol=1e-5, rtol=1e-5, equal_nan=True)
    assert got[0].isfinite().all()
    assert [r for r in caplog.records if "a 4-D attention mask runs through PyTorch" in r.getMessage()]


def _family_configs() -> dict[str, Any]:
    import transformers as tf

    small = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    return {
        "gemma3-sliding": tf.Gemma3TextConfig(
            **small, **heads, head_dim=16, sliding_window=6, query_pre_attn_scalar=16
        ),
        "qwen2-sliding": tf.Qwen2Config(
            **small, **heads, use_sliding_window=True, sliding_window=6, max_window_layers=1
        ),
        "phi3": tf.Phi3Config(**small, **heads, pad_token_id=0),
        "mixtral-moe": tf.MixtralConfig(**small, **heads, num_local_experts=4, num_experts_per_tok=2),
        "gpt-neox": tf.GPTNeoXConfig(**small, num_attention_heads=4),
        "olmo2": tf.Olmo2Config(**small, **heads),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_family_configs()))
def test_other_model_families_pack_like_each_document_alone(adapter: Any, name: str) -> None:
    # Beyond the four the issue names: other attention layouts (q/k norms, partial rotary,
    # MoE, alternating sliding layers) through the same interface, against "eager".
    cfg = _family_configs()[name]
    lens = [*_packing(zlib.crc32(name.encode())), 1]  # and a 1-token document
    _, _, packed, alone = _packed_and_alone(_model(cfg, "fa4cache"), _model(cfg, "eager"), lens)
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=2e-5, msg=lambda m: f"lens {lens}: {m}")


# --------------------------------------------------------------------------- masks the FA4 path does not model
# Each case once attended the wrong keys without a word (a model-family sweep found them):
# now eager's output, through FA4 where FA4 computes the mask, else through PyTorch.


def _pair(cls: Any, cfg: Any) -> tuple[Any, Any]:
    import copy

    out = []
    for impl in ("eager", "fa4cache"):
        torch.manual_seed(0)
        make = getattr(cls, "_from_config", None) or cls.from_config  # Auto classes have only the public one
        out.append(make(copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.float32).eval())
    return out[0], out[1]


def _same_generation(ref: Any, got: Any, **inputs: Any) -> None:
    kw = dict(
        max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0
    )
    with torch.no_grad():
        a, b = ref.generate(**inputs, **kw), got.generate(**inputs, **kw)
    torch.testing.assert_close(torch.stack(b.logits), torch.stack(a.logits), atol=1e-4, rtol=1e-4)


def _llama4_chunked() -> Any:
    from transformers import Llama4TextConfig

    return Llama4TextConfig(
        hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=97, attention_chunk_size=4,
        num_local_experts=2, num_experts_per_tok=1, no_rope_layers=[1, 1], interleave_moe_layer_step=1,
        layer_types=["chunked_attention", "chunked_attention"],
    )  # fmt: skip


def _gemma3_with_images() -> Any:
    from transformers import Gemma3Config

    return Gemma3Config(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=300, sliding_window=16,
                         query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298,
    )  # fmt: skip


def test_llama4_chunked_attention_keeps_its_chunks(adapter: Any) -> None:
    from transformers import Llama4ForCausalLM

    cfg = _llama4_chunked()
    ref, got = _pair(Llama4ForCausalLM, cfg)
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    att = torch.ones(2, 12, dtype=torch.long)
    att[1, :4] = 0
    with torch.no_grad():  # chunked was attended as plain causal: 0.3-0.6 off from the 5th token on
        torch.testing.assert_close(got(input_ids=ids, attention_mask=att).logits[att.bool()],
                                   ref(input_ids=ids, attention_mask=att).logits[att.bool()], atol=1e-5, rtol=1e-5)  # fmt: skip
    _same_generation(ref, got, input_ids=ids, attention_mask=att)


def test_gemma3_image_tokens_see_each_other(adapter: Any) -> None:
    from transformers import Gemma3ForConditionalGeneration

    cfg = _gemma3_with_images()
    ref, got = _pair(Gemma3ForConditionalGeneration, cfg)
    emb = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(2))
    types = torch.zeros(2, 12, dtype=torch.long)
    types[:, 3:7] = 1  # four image tokens (no pixels needed: the embeddings stand in)
    att = torch.ones(2, 12, dtype=torch.long)
    att[1, :2] = 0
    keep = att.bool()
    with torch.no_grad():
        for tt in (types, None):  # with image tokens (0.2 off before), and text alone (the FA4 path)
            a = ref(inputs_embeds=emb, attention_mask=att, token_type_ids=tt).logits
            b = got(inputs_embeds=emb, attention_mask=att, token_type_ids=tt).logits
            torch.testing.assert_close(b[keep], a[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_cross_attention_as_long_as_the_padded_encoder_reads_its_mask_as_keys(
    adapter: Any, family: str
) -> None:
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    if family == "t5":
        cfg = AutoConfig.for_model("t5", d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, vocab_size=128, pad_token_id=0, decoder_start_token_id=0, eos_token_id=1)  # fmt: skip
    else:
        cfg = AutoConfig.for_model(
            "bart", d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128,
            max_position_embeddings=64, pad_token_id=1,
        )  # fmt: skip
    ref, got = _pair(AutoModelForSeq2SeqLM, cfg)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (3, 12), generator=g)
    att = torch.ones(3, 12, dtype=torch.long)
    att[1, : int(torch.randint(1, 8, (), generator=g))] = 0  # left padding
    att[2, int(torch.randint(4, 11, (), generator=g)) :] = 0  # right padding
    for length in (12, 7):  # as long as the encoder (read as documents before: up to 2.2 off), and shorter
        dec = torch.randint(3, 128, (3, length), generator=g)
        with torch.no_grad():
            a = ref(input_ids=ids, attention_mask=att, decoder_input_ids=dec).logits
            b = got(input_ids=ids, attention_mask=att, decoder_input_ids=dec).logits
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_bert_style_cross_attention_as_long_as_the_padded_encoder_reads_its_mask_as_keys(
    adapter: Any,
) -> None:
    # BERT's cross-attention layers (and T5Gemma's, Dia's, GPT-2's) carry no is_decoder: with the
    # decoder as long as the padded encoder, the encoder's mask was read as the decoder's documents.
    from transformers import BertConfig, BertLMHeadModel

    cfg = BertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, is_decoder=True, add_cross_attention=True)  # fmt: skip
    ref, got = _pair(BertLMHeadModel, cfg)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 97, (3, 12), generator=g)
    enc = torch.randn(3, 12, 64, generator=g)
    enc_mask = torch.ones(3, 12, dtype=torch.long)
    enc_mask[1, : int(torch.randint(1, 8, (), generator=g))] = 0
    enc_mask[2, int(torch.randint(4, 11, (), generator=g)) :] = 0
    with torch.no_grad():
        a = ref(input_ids=ids, encoder_hidden_states=enc, encoder_attention_mask=enc_mask).logits
        b = got(input_ids=ids, encoder_hidden_states=enc, encoder_attention_mask=enc_mask).logits
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_esmc_chains_stay_apart(adapter: Any) -> None:
    # ESMC passes its chains as an and_mask_function of packed documents: transformers' own
    # rule, but from the model's sequence_id, not position_ids (the chains attended each other).
    from transformers import EsmcConfig, EsmcModel

    cfg = EsmcConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    ref, got = _pair(EsmcModel, cfg)
    ids = torch.randint(4, 30, (2, 10), generator=torch.Generator().manual_seed(4))
    chains = torch.tensor([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3])
    with torch.no_grad():
        a = ref(input_ids=ids, sequence_id=chains).last_hidden_state
        b = got(input_ids=ids, sequence_id=chains).last_hidden_state
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_a_flattened_batch_keeps_llama4_chunks(adapter: Any) -> None:
    # A flattening collator's cu_seq_lens beside the hook's 4-D mask (Llama 4's chunks): the
    # layer warned that it ran through PyTorch, then ran FA4's plain causal documents.
    from transformers import Llama4ForCausalLM

    cfg = _llama4_chunked()
    ref, got = _pair(Llama4ForCausalLM, cfg)
    lens = [7, 9]
    ids = torch.randint(3, 97, (1, sum(lens)), generator=torch.Generator().manual_seed(5))
    pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1)
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
    flat = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lens), "max_length_k": max(lens)}
    with torch.no_grad():  # (eager reads the packing from position_ids; Llama 4's scaling
        # of queries by position is by index, so documents alone are no reference)
        b = got(input_ids=ids, position_ids=pos, **flat).logits
        a = ref(input_ids=ids, position_ids=pos).logits
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_gemma3_image_tokens_see_each_other_when_compiled(adapter: Any, caplog: Any) -> None:
    # Traced, the hook cannot open transformers' closures: it read nothing there and ran the
    # image tokens as plain causal. It now reads the rule's name (an "or" at the top) and, for
    # packed documents of a family that passes block_sequence_ids, keeps transformers' mask.
    # The warning is deferred past the graph (logging inside one refused fullgraph).
    from transformers import Gemma3ForConditionalGeneration

    cfg = _gemma3_with_images()
    ref, got = _pair(Gemma3ForConditionalGeneration, cfg)
    fht, _ = adapter
    fht._warned.clear()
    emb = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(6))
    types = torch.zeros(2, 12, dtype=torch.long)
    types[:, 3:7] = 1
    att = torch.ones(2, 12, dtype=torch.long)
    keep = att.bool()
    pos = torch.tensor([list(range(5)) + list(range(7))] * 2)  # two documents a row: packed
    torch._dynamo.reset()
    run = torch.compile(got, fullgraph=True, backend="eager")
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        for kw in ({"attention_mask": att}, {"position_ids": pos}):
            a = ref(inputs_embeds=emb, token_type_ids=types, **kw).logits
            b = run(inputs_embeds=emb, token_type_ids=types, **kw).logits
            torch.testing.assert_close(b[keep], a[keep], atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    assert [r for r in caplog.records if "runs through PyTorch" in r.getMessage()], caplog.records


def test_paligemma_prefix_is_bidirectional_when_compiled_and_packed(adapter: Any) -> None:
    # PaliGemma hands its mask maker Gemma's text config (model_type "gemma"): the family is
    # known by the config objects of the model built with "fa4cache", not by their type. Its
    # prefix (token_type_ids 0) sees itself both ways; packed and compiled, it was causal.
    from fa4cache.adapters.transformers.mask_functions import block_family
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    cfg = PaliGemmaConfig(
        text_config=dict(model_type="gemma", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14, projection_dim=64),
        image_token_index=299, projection_dim=64,
    )  # fmt: skip
    ref, got = _pair(PaliGemmaForConditionalGeneration, cfg)
    assert block_family(got.config.get_text_config()) and not block_family(ref.config.get_text_config())
    emb = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(8))
    types = torch.tensor([[0] * 3 + [1] * 2 + [0] * 4 + [1] * 3])  # two documents: a prefix, then text
    pos = torch.tensor([list(range(5)) + list(range(7))])
    torch._dynamo.reset()
    run = torch.compile(got, fullgraph=True, backend="eager")
    with torch.no_grad():
        a = ref(inputs_embeds=emb, token_type_ids=types, position_ids=pos).logits
        b = run(inputs_embeds=emb, token_type_ids=types, position_ids=pos).logits
    torch._dynamo.reset()
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_rows_made_under_inference_mode_do_not_reach_training(adapter: Any) -> None:
    # One document per row (no mask): the offsets were kept from an inference_mode call, and a
    # training step with the same shape could not save them for backward.
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
                    image_size=32, patch_size=8)  # fmt: skip
    _, got = _pair(ViTModel, cfg)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        got(pixel_values=x)
    got.train()
    got(pixel_values=x).last_hidden_state.sum().backward()
    with torch.inference_mode():
        got(pixel_values=x)
    got(pixel_values=x).last_hidden_state.sum().backward()  # and the other way round


def test_a_mask_with_a_gap_is_refused_not_read_as_two_documents(adapter: Any) -> None:
    # A token masked out between tokens: read as two documents before (0.4 off eager's logits),
    # now refused by name (finding it on the host would be a sync in every forward).
    cfg = _configs()["llama-gqa"]
    got = _model(cfg, "fa4cache")
    ids = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3))
    att = torch.ones(2, 10, dtype=torch.long)
    att[0, 4] = 0
    att[1, :2] = 0
    with (
        torch.no_grad(),
        pytest.raises(RuntimeError, match="one run of tokens per row.*attn_implementation='sdpa'"),
    ):
        got(input_ids=ids, attention_mask=att)
    att[0, 4] = 1  # padding at either end is fine
    att[0, 8:] = 0
    with torch.no_grad():
        got(input_ids=ids, attention_mask=att)


def test_an_encoder_without_a_mask_runs_each_row_on_fa4(adapter: Any, caplog: Any) -> None:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                    image_size=32, patch_size=8)  # fmt: skip
    ref, got = _pair(ViTModel, cfg)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    fht, calls = adapter
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        b = got(pixel_values=x).last_hidden_state  # was: "no position_ids ... to find documents in"
        a = ref(pixel_values=x).last_hidden_state
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert calls["masks"] == 1 and not caplog.records, caplog.records  # one mask, shared; no fallback


def test_models_with_attention_code_of_their_own_are_refused_by_name(adapter: Any) -> None:
    # transformers accepts any registered name for any model. These never call the attention
    # interface (on 5.17-5.25): fa4cache never ran, and the hook's 2-D mask was read as their
    # own 4-D one (Bloom 0.016 off, MPT 0.3 off, shape errors). Falcon moved to the interface in
    # 5.25: there it is accepted, and equal to eager and sdpa; before, refused (a bare KeyError).
    from transformers import AutoConfig, AutoModel

    small = dict(hidden_size=64, n_embd=64, d_model=64, num_attention_heads=4, n_head=4, n_heads=4, num_heads=4,
                 num_hidden_layers=1, n_layer=1, n_layers=1, num_layers=1, vocab_size=97)  # fmt: skip
    for family, fix in (
        ("bloom", "'eager'$"),
        ("falcon", "'eager' or 'sdpa'"),
        ("gpt_neo", "'eager'"),
        ("mpt", "'eager'"),
    ):
        cfg = AutoConfig.for_model(family)
        for k, v in small.items():
            if hasattr(cfg, k):
                setattr(cfg, k, v)
        if family == "falcon" and _calls_the_interface("falcon"):
            _same_as_eager_and_sdpa(cfg)
            continue
        with pytest.raises(ValueError, match=f"does not call transformers' attention interface.*{fix}"):
            AutoModel.from_config(cfg, attn_implementation="fa4cache")
    AutoModel.from_config(_configs()["llama-gqa"], attn_implementation="fa4cache")  # the interface's own


@pytest.fixture
def sweep_calls(adapter: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A counter of the calls of fa4cache's attention (``calls["attention"]``), which the
    model sweep reads to tell a model that runs fa4cache from one that only accepts it."""
    import collections

    from transformers import AttentionInterface

    fht, _ = adapter
    calls: collections.Counter[str] = collections.Counter()

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["attention"] += 1
        return fht.attention_forward(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, fht.NAME, counting)
    return calls


@pytest.mark.parametrize(
    "family, verdict",
    [
        # Layers whose causality disagrees with the mask the model builds (0.03-0.3 off eager
        # before): Splinter's say nothing under a bidirectional mask; PEGASUS-X's and
        # NLLB-MoE's decoders, and PaliGemma's Gemma, say is_causal=False under a causal one.
        ("splinter", "match"),
        ("pegasus_x", "match"),
        ("nllb-moe", "match"),
        ("paligemma", "match"),
        # Attention layers picked from a table of the model's own by implementation name (a
        # bare KeyError: 'fa4cache' while the model was built), for a composite model by its part.
        ("git", "refused"),
        ("sam", "refused"),
        ("deepseek_vl_hybrid", "refused"),
        # Layer code of their own reads the mask as transformers' 4-D one (a shape error at the
        # forward before).
        ("bigbird_pegasus", "refused"),
        ("doge", "refused"),
        ("t5gemma2", "refused"),
        # The sweep's own: DPR's pooled token was a padding token, ViT-MAE's masking unseeded.
        ("dpr", "match"),
        ("vit_mae", "match"),
    ],
)
def test_a_model_family_the_sweep_found_wrong_is_refused_by_name_or_matches_eager(
    sweep_calls: Any, family: str, verdict: str
) -> None:
    from tests.helpers import model_sweep

    calls = sweep_calls
    outcome = model_sweep.check(family, calls)
    assert outcome.verdict == verdict, outcome
    if verdict == "refused":  # (the sweep counts a refusal only where it names 'eager')
        assert (
            "picks its attention layers by implementation name" in outcome.detail
            or "reads the attention mask as transformers' 4-D mask" in outcome.detail
        ), outcome


def _calls_the_interface(family: str) -> bool:
    """Whether the installed transformers' attention layer of ``family`` looks its attention
    up in the interface (what the test expects of the adapter, read here from the source)."""
    import importlib
    import inspect

    code = inspect.getsource(importlib.import_module(f"transformers.models.{family}.modeling_{family}"))
    return "ALL_ATTENTION_FUNCTIONS.get_interface(" in code


def _same_as_eager_and_sdpa(cfg: Any) -> None:
    import copy

    from transformers import AutoModel

    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    att = torch.ones(2, 9, dtype=torch.long)
    att[1, :3] = 0
    out = {}
    for impl in ("eager", "sdpa", "fa4cache"):
        torch.manual_seed(0)
        model = AutoModel.from_config(
            copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.float32
        ).eval()
        with torch.no_grad():
            out[impl] = model(input_ids=ids, attention_mask=att).last_hidden_state[att.bool()]
    torch.testing.assert_close(out["fa4cache"], out["eager"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["fa4cache"], out["sdpa"], atol=1e-5, rtol=1e-5)


def test_falcon_with_alibi_is_refused_by_name_not_attended_without_causality(adapter: Any) -> None:
    # transformers 5.25's Falcon calls the attention interface, but with ALiBi it adds the bias
    # to the mask it got from the mask hook: for fa4cache the 2-D padding mask, so the 4-D mask
    # the layer got had no causal rule (batch 1: 1.65 off eager). Refused by name; rotary
    # Falcon (the default) matches eager and sdpa, packed too.
    import copy

    from transformers import AutoModel, FalconConfig

    if not _calls_the_interface("falcon"):
        pytest.skip(f"transformers {transformers.__version__}'s Falcon is refused when loaded")
    kw = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=97)
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    alibi = AutoModel.from_config(FalconConfig(**kw, alibi=True), attn_implementation="fa4cache").eval()
    with (
        torch.no_grad(),
        pytest.raises(ValueError, match="FalconAttention adds terms of its own.*'eager' or 'sdpa'"),
    ):
        alibi(input_ids=ids[:1], attention_mask=torch.ones(1, 9, dtype=torch.long))
    # Without a mask, or at batch 2, Falcon's own code fails on the hook's mask before its
    # attention runs (a bare AttributeError, a shape error): an error, never a result.
    for inputs in (
        {"input_ids": ids[:1]},
        {"input_ids": ids, "attention_mask": torch.ones(2, 9, dtype=torch.long)},
    ):
        with torch.no_grad(), pytest.raises((AttributeError, RuntimeError, ValueError)):
            alibi(**inputs)
    for arch in ({}, {"new_decoder_architecture": True, "num_kv_heads": 2}):
        cfg = FalconConfig(**kw, **arch)
        _same_as_eager_and_sdpa(cfg)
        lens = [*_packing(zlib.crc32(str(arch).encode())), 1]
        torch.manual_seed(0)
        got = AutoModel.from_config(copy.deepcopy(cfg), attn_implementation="fa4cache").eval()
        torch.manual_seed(0)
        ref = AutoModel.from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
        ids = torch.randint(0, 97, (1, sum(lens)))
        pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1)
        cu = [0, *itertools.accumulate(lens)]
        with torch.no_grad():
            packed = got(input_ids=ids, position_ids=pos).last_hidden_state[0]
            alone = torch.cat(
                [ref(input_ids=ids[:, a:b]).last_hidden_state[0] for a, b in zip(cu[:-1], cu[1:])]
            )
        torch.testing.assert_close(
            packed, alone, atol=1e-5, rtol=1e-5, msg=lambda m, lens=lens: f"lens {lens}: {m}"
        )


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("FA4CACHE_MODEL_SWEEP") != "1",
    reason="the sweep over every model family takes 30-45 min on 2 cores: FA4CACHE_MODEL_SWEEP=1 runs it",
)
def test_every_registered_model_family_is_refused_by_name_or_matches_eager(sweep_calls: Any) -> None:
    # Each family transformers registers, built tiny from its own config: refused by name, or
    # accepted, running fa4cache's attention and equal to eager. Never accepted and wrong.
    import collections

    from tests.helpers import model_sweep

    calls = sweep_calls
    outcomes = [model_sweep.check(f, calls) for f in model_sweep.families()]
    for o in outcomes:
        print(f"{o.family:32} {o.verdict:24} {o.detail}")
    counts = collections.Counter(o.verdict for o in outcomes)
    print(
        f"transformers {transformers.__version__}:",
        ", ".join(f"{v} {counts[v]}" for v in model_sweep.VERDICTS),
    )
    bad = [o for o in outcomes if o.verdict in model_sweep.BAD]
    assert not bad, "\n".join(f"{o.family}: {o.verdict}: {o.detail}" for o in bad)


def test_an_encoder_passing_its_own_one_row_mask_still_matches_eager(adapter: Any) -> None:
    # LayoutLM builds its own [B, 1, 1, T] additive padding mask and says nothing of causality:
    # the ALiBi guard (a layer that says is_causal=True) must not refuse it (a first version did).
    from transformers import LayoutLMConfig, LayoutLMModel

    cfg = LayoutLMConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=97
    )
    ref, got = _pair(LayoutLMModel, cfg)
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    att = torch.ones(2, 9, dtype=torch.long)
    att[1, 6:] = 0
    with torch.no_grad():
        b = got(input_ids=ids, attention_mask=att).last_hidden_state[att.bool()]
        a = ref(input_ids=ids, attention_mask=att).last_hidden_state[att.bool()]
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
