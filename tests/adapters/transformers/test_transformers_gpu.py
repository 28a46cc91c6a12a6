"""transformers with attn_implementation="fa4cache" on the GPU: tiny random-init models, real FA4.

Tolerances: bf16 models; packed logits against each document run alone through SDPA in
the same model, compared by relative norm (bf16 noise is about 1e-2 after a few layers).
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = (
    Path(__file__).resolve().parents[3]
)  # importable as tests.* from here (the GPU run uses importlib mode)

pytestmark = pytest.mark.gpu


def _rel(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _configs() -> dict[str, Any]:
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config

    small = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3}
    return {
        "llama-mha": LlamaConfig(**small, num_attention_heads=4, num_key_value_heads=4, head_dim=64),
        "llama-gqa": LlamaConfig(**small, num_attention_heads=8, num_key_value_heads=2, head_dim=64),
        "qwen3": Qwen3Config(**small, num_attention_heads=4, num_key_value_heads=2, head_dim=128),
        "mistral-sliding": MistralConfig(
            **small, num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=100
        ),
        # Head dim 256, sliding and full layers alternating, q/k norms.
        "gemma3-d256": Gemma3TextConfig(
            **small,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=256,
            sliding_window=100,
            query_pre_attn_scalar=256,
        ),  # fmt: skip
    }


def _model(cfg: Any, impl: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16)
    assert m.config._attn_implementation == impl
    return m.cuda()


def _packed(lens: list[int], vocab: int) -> dict[str, Any]:
    import torch

    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return {
        "input_ids": torch.randint(0, vocab, (1, T), device="cuda"),
        "position_ids": torch.cat([torch.arange(n) for n in lens]).view(1, -1).cuda(),
        "cu": cu,
    }


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", list(_configs()))
def test_packed_logits_and_gradients_match_each_document_alone(name: str, batch: int) -> None:
    import torch
    from fa4cache.adapters import transformers as fht

    fht.register()
    cfg = _configs()[name]
    ours, ref = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    rng = random.Random(len(name) + 100 * batch)
    T = 1800
    rows = []
    for _ in range(batch):  # each row packed with its own documents, all T tokens used
        lens = [rng.choice([1, 37, 128, 300, 515]) for _ in range(5)]
        while sum(lens) >= T:  # five draws can pass T
            lens.pop()
        rows.append([*lens, T - sum(lens)])
    packed = [_packed(lens, cfg.vocab_size) for lens in rows]
    ids = torch.cat([b["input_ids"] for b in packed])
    out = ours(input_ids=ids, position_ids=torch.cat([b["position_ids"] for b in packed])).logits
    out.float().square().mean().backward()
    alone = []
    for r, b in enumerate(packed):
        for a, e in zip(b["cu"][:-1].tolist(), b["cu"][1:].tolist()):
            o = ref(input_ids=ids[r : r + 1, a:e]).logits
            o.float().square().mean().mul((e - a) / ids.numel()).backward()
            alone.append(o)
    ref_out = torch.cat(alone, 1).view_as(out)
    assert _rel(out, ref_out) < 2e-2, _rel(out, ref_out)
    # The loss above weighs every token the same in both runs, so gradients match too.
    for (n, p), (_, r) in zip(ours.named_parameters(), ref.named_parameters()):
        if p.grad is not None and r.grad is not None and r.grad.norm() > 0:
            assert _rel(p.grad, r.grad) < 5e-2, (n, _rel(p.grad, r.grad))


def test_training_reduces_the_loss_and_compiles_once() -> None:
    import torch
    from fa4cache.adapters import transformers as fht

    import fa4cache

    fht.register()
    store = fa4cache.install()
    cfg = _configs()["qwen3"]
    model = _model(cfg, "fa4cache")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    torch.manual_seed(1)
    # A learnable task: every document repeats the same short pattern.
    losses, compiles = [], []
    pattern = torch.randint(0, cfg.vocab_size, (8,), device="cuda")
    for _ in range(20):
        lens = [rng.randint(16, 400) for _ in range(rng.randint(2, 8))]
        b = _packed(lens, cfg.vocab_size)
        ids = torch.cat([pattern.repeat(n // 8 + 1)[:n] for n in lens]).view(1, -1)
        out = model(input_ids=ids, position_ids=b["position_ids"], labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(out.loss))
        store.counters.flush()
        compiles.append(int(store.counters.values["compiles"]))
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses
    assert compiles[-1] == compiles[0], compiles  # nothing compiled after the first packing


SECOND = r"""
import json, torch, random, fa4cache
from fa4cache.adapters import transformers as fht
from tests.adapters.transformers.test_transformers_gpu import _configs, _model, _packed
fht.register()
store = fa4cache.install()
cfg = _configs()["qwen3"]
model = _model(cfg, "fa4cache")
rng = random.Random(5)
for _ in range(3):
    b = _packed([rng.randint(16, 400) for _ in range(4)], cfg.vocab_size)
    model(input_ids=b["input_ids"], position_ids=b["position_ids"], labels=b["input_ids"]).loss.backward()
torch.cuda.synchronize()
store.counters.flush()
print("RESULT", json.dumps({k: store.counters.values[k] for k in ("compiles", "disk_hits")}))
"""


def test_a_second_process_compiles_nothing(tmp_path: Any) -> None:
    import os

    env = dict(
        os.environ,
        FA4CACHE_DIR=str(tmp_path / "store"),
        PYTHONPATH=os.environ.get("PYTHONPATH", "") + ":" + str(ROOT),
    )
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-c", SECOND], cwd="/tmp", env=env, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.split("RESULT", 1)[1]))
    assert (
        runs[0]["compiles"] > 0 and runs[1]["compiles"] == 0 and runs[1]["disk_hits"] == runs[0]["compiles"]
    ), runs


def test_cuda_graph_capture_and_replay_with_new_packings() -> None:
    import torch
    from fa4cache.adapters import transformers as fht

    T = 2048
    fht.register(max_documents=32)  # documents from position_ids without a host sync
    cfg = _configs()["llama-gqa"]
    model = _model(cfg, "fa4cache").eval()
    rng = random.Random(3)

    def packing() -> list[int]:
        cuts = sorted(rng.sample(range(1, T), rng.randint(1, 20)))
        return [b - a for a, b in zip([0, *cuts], [*cuts, T])]

    static_ids = torch.zeros(1, T, dtype=torch.long, device="cuda")
    static_pos = torch.zeros(1, T, dtype=torch.long, device="cuda")

    def stage(lens: list[int]) -> None:
        b = _packed(lens, cfg.vocab_size)
        static_ids.copy_(b["input_ids"])
        static_pos.copy_(b["position_ids"])

    def fwd() -> Any:
        return model(input_ids=static_ids, position_ids=static_pos, use_cache=False).logits

    stage(packing())
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fwd()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fwd()
        for _ in range(4):
            stage(packing())
            g.replay()
            eager = fwd()
            torch.cuda.synchronize()
            assert _rel(out, eager) < 1e-3


def test_torch_compile_matches_eager() -> None:
    # torch.compile (inductor) around a model with the fa4cache attention: one graph (the
    # attention is a custom op; fullgraph=True raises on a graph break), no recompile for a
    # new packing, and loss and gradients match the eager model.
    import torch
    from fa4cache.adapters import transformers as fht

    fht.register()
    cfg = _configs()["qwen3"]
    eager, compiled = _model(cfg, "fa4cache"), _model(cfg, "fa4cache")
    run = torch.compile(compiled, fullgraph=True)
    from torch._dynamo import config as dynamo_config

    rng = random.Random(5)
    for i in range(3):
        dynamo_config.error_on_recompile = i > 0
        lens = [rng.choice([1, 37, 128, 300]) for _ in range(5)]
        lens.append(1200 - sum(lens))
        b = _packed(lens, cfg.vocab_size)
        got = []
        for model, fn in ((eager, eager), (compiled, run)):
            model.zero_grad()
            loss = fn(
                input_ids=b["input_ids"], position_ids=b["position_ids"].clone(), labels=b["input_ids"]
            ).loss
            loss.backward()
            got.append((loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
        assert abs(float(got[0][0]) - float(got[1][0])) < 2e-2 * abs(float(got[0][0]))
        assert _rel(got[1][1], got[0][1]) < 5e-2
    dynamo_config.error_on_recompile = False


def test_softcapped_packed_batch_runs_on_fa4_and_matches_eager(caplog: Any) -> None:
    # Gemma 2 softcaps attention logits: FA4's kernels cap (forward and backward), packed
    # documents stay apart, and logits and gradients match each document alone through
    # transformers' eager attention (bf16). q/k weights are scaled so that the cap bites,
    # and a model without the cap is checked to differ.
    import logging

    import torch
    from fa4cache.adapters import transformers as fht
    from transformers import Gemma2Config

    fht.register()
    cfg = Gemma2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, sliding_window=100, query_pre_attn_scalar=64,
        attn_logit_softcapping=5.0,
    )  # fmt: skip
    uncapped_cfg = copy.deepcopy(cfg)
    uncapped_cfg.attn_logit_softcapping = None
    models = [_model(cfg, "fa4cache"), _model(cfg, "eager"), _model(uncapped_cfg, "eager")]
    for m in models:
        for n, w in m.named_parameters():
            if n.endswith(("q_proj.weight", "k_proj.weight")):
                w.data *= 6
    ours, ref, uncapped = models
    lens = [300, 1, 515, 37, 400]
    b = _packed(lens, cfg.vocab_size)
    cu = b["cu"].tolist()
    with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        out = ours(input_ids=b["input_ids"], position_ids=b["position_ids"]).logits
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # no fallback
    out.float().square().mean().backward()
    alone, free = [], []
    for a, e in zip(cu[:-1], cu[1:]):
        o = ref(input_ids=b["input_ids"][:, a:e]).logits
        o.float().square().mean().mul((e - a) / out.shape[1]).backward()
        alone.append(o)
        with torch.no_grad():
            free.append(uncapped(input_ids=b["input_ids"][:, a:e]).logits)
    alone_out = torch.cat(alone, 1)
    assert _rel(out, alone_out) < 2e-2, _rel(out, alone_out)
    assert _rel(torch.cat(free, 1), alone_out) > 0.1, "the cap does not bite: the test would miss it"
    for (n, p), (_, r) in zip(ours.named_parameters(), ref.named_parameters()):
        if p.grad is not None and r.grad is not None and r.grad.norm() > 0:
            assert _rel(p.grad, r.grad) < 5e-2, (n, _rel(p.grad, r.grad))
