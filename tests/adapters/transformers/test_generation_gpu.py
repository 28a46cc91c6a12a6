"""Generation with a KV cache under ``attn_implementation="fa4cache"`` on the GPU: real FA4,
tiny random-init bf16 models.

Tolerance: a bf16 model's logits are compared with the same weights in float32 (SDPA, or
eager for softcapping); fa4cache's error must stay within a small factor of SDPA's own
bf16 error against that reference, at every decode step.
"""

from __future__ import annotations

import copy
import logging
import os
import random
from typing import Any

import pytest

from tests.helpers.switches import set_switch
from tests.helpers.transformers_compat import cache_kwarg

pytestmark = pytest.mark.gpu

SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", "0"))


def _rel(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _configs() -> dict[str, Any]:
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen3Config

    small = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3}
    return {
        "llama-gqa": LlamaConfig(**small, num_attention_heads=8, num_key_value_heads=2, head_dim=64),
        "qwen3": Qwen3Config(**small, num_attention_heads=4, num_key_value_heads=2, head_dim=128),
        "mistral-sliding": MistralConfig(
            **small, num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=40
        ),
        "gemma2-softcap": Gemma2Config(
            **small,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            sliding_window=40,
            attn_logit_softcapping=50.0,
            query_pre_attn_scalar=128,
        ),  # fmt: skip
    }


def _reference(cfg: Any) -> str:
    return "eager" if getattr(cfg, "attn_logit_softcapping", None) else "sdpa"


def _model(cfg: Any, impl: str, dtype: Any = None, state: Any = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype or torch.bfloat16
    )
    if state is not None:
        m.load_state_dict(state)
    # transformers 5.2x drops "paged|"; 5.17 (the H200 image's) keeps it.
    assert m.config._attn_implementation in (impl, impl.removeprefix("paged|"))
    return m.cuda().eval()


def _left_padded(rng: random.Random, batch: int, length: int, vocab: int) -> tuple[Any, Any]:
    import torch

    ids = torch.randint(0, vocab, (batch, length), device="cuda")
    mask = torch.ones(batch, length, dtype=torch.long, device="cuda")
    for b in range(1, batch):
        mask[b, : rng.randrange(0, length - 4)] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _teacher_forced(model: Any, ids: Any, mask: Any, follow: Any, kind: str) -> list[Any]:
    import torch
    from transformers import DynamicCache, StaticCache

    n = ids.shape[1] + follow.shape[1] + 7
    cache = (
        DynamicCache(config=model.config) if kind == "dynamic" else StaticCache(model.config, max_cache_len=n)
    )
    outs = []
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        outs.append(
            model(input_ids=ids, attention_mask=mask, position_ids=pos, **{cache_kwarg(): cache}).logits
        )
        for t in range(follow.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = mask.sum(-1, keepdim=True) - 1
            outs.append(
                model(
                    input_ids=follow[:, t : t + 1],
                    attention_mask=mask,
                    position_ids=pos,
                    **{cache_kwarg(): cache},
                ).logits
            )
    return outs


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The adapter registered; counts the KV-cache op's Python launches of FA4 (replayed or
    planned; a CUDA-graph replay makes none), and apart from them the one-row steps run on
    SDPA's kernel (:mod:`fa4cache.decode.one_row_sdpa`)."""
    from fa4cache.adapters import transformers as fht

    from fa4cache.decode import lanes, one_row_sdpa
    from fa4cache.decode import launch as decode_launch

    fht.register()
    fht._warned.clear()
    calls = {"n": 0, "one_row": 0}
    inside = [0]
    real_launch, real_fa4, real_lane = decode_launch.launch, decode_launch._fa4_forward, lanes._Lane.launch

    def lane(self: Any, *a: Any) -> None:  # a later layer's launch, from its step's lane
        calls["n"] += 1
        real_lane(self, *a)

    def launch(*a: Any, **kw: Any) -> Any:  # a KV-cache step's launch (replayed or planned)
        calls["n"] += 1
        inside[0] += 1
        try:
            return real_launch(*a, **kw)
        finally:
            inside[0] -= 1

    def fa4(*a: Any, **kw: Any) -> Any:  # continuous batching's, and paged decode's
        calls["n"] += inside[0] == 0
        return real_fa4(*a, **kw)

    real_one_row = one_row_sdpa.forward

    def one_row(*a: Any) -> Any:  # a one-row step on SDPA's kernel (counted apart)
        calls["one_row"] += 1
        return real_one_row(*a)

    monkeypatch.setattr(decode_launch, "launch", launch)
    monkeypatch.setattr(decode_launch, "_fa4_forward", fa4)
    monkeypatch.setattr(lanes._Lane, "launch", lane)
    monkeypatch.setattr(one_row_sdpa, "forward", one_row)
    return calls


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("name", list(_configs()))
def test_teacher_forced_decode_logits(
    seen: Any, caplog: Any, monkeypatch: pytest.MonkeyPatch, name: str, batch: int, kind: str
) -> None:
    import torch

    seed = SEED + 17 * batch + len(name) + (kind == "static")
    print(f"seed {seed}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    cfg = _configs()[name]
    ours = _model(cfg, "fa4cache")
    bf16 = _model(cfg, _reference(cfg))
    exact = _model(cfg, _reference(cfg), dtype=torch.float32)
    ids, mask = _left_padded(rng, batch, rng.randint(60, 90), cfg.vocab_size)  # prompts past the window
    follow = torch.randint(0, cfg.vocab_size, (batch, 24), device="cuda")
    with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
        runs = [_teacher_forced(ours, ids, mask, follow, kind)]
        one_row = seen["one_row"]
        if batch == 1 and kind == "dynamic":
            # One row without padding: full layers run SDPA's kernel by default; FA4's own too.
            set_switch(monkeypatch, "FA4CACHE_ONE_ROW_SDPA", "0")
            runs.append(_teacher_forced(ours, ids, mask, follow, kind))
    base = _teacher_forced(bf16, ids, mask, follow, kind)
    want = _teacher_forced(exact, ids, mask, follow, kind)
    valid = mask.bool()
    for got in runs:
        for t, (a, b, w) in enumerate(zip(got, base, want)):
            a, b, w = (x[valid] if t == 0 else x for x in (a, b, w))
            err, ref_err = _rel(a, w), _rel(b, w)
            assert err <= 2 * ref_err + 2e-3, (t, err, ref_err)
    assert not [r for r in caplog.records if "runs through PyTorch" in r.getMessage()]
    steps = cfg.num_hidden_layers * follow.shape[1]
    full_only = batch == 1 and kind == "dynamic" and name in ("llama-gqa", "qwen3")
    assert one_row == (steps if full_only else 0), (one_row, seen)
    assert seen["one_row"] == one_row  # none with the setting off
    assert seen["n"] + one_row >= steps * len(runs), seen


def _patterned_state(cfg: Any) -> Any:
    """Weights trained briefly (float32) on a fixed pattern, (7 t + 3) mod V after t: greedy
    choices far from ties, so tokens must agree exactly between attention paths."""
    import torch

    m = _model(cfg, "sdpa", dtype=torch.float32).train()
    opt = torch.optim.Adam(m.parameters(), lr=2e-3)
    for _ in range(150):
        x = torch.randint(0, cfg.vocab_size, (32, 1), device="cuda")
        seq = [x]
        for _ in range(63):
            seq.append((seq[-1] * 7 + 3) % cfg.vocab_size)
        ids = torch.cat(seq, 1)
        loss = m(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in m.state_dict().items()}


def _pattern_prompts(rng: random.Random, batch: int, length: int, vocab: int) -> tuple[Any, Any]:

    ids, mask = _left_padded(rng, batch, length, vocab)
    for b in range(batch):
        n = int(mask[b].sum())
        tok = rng.randrange(vocab)
        for t in range(length - n, length):
            ids[b, t] = tok
            tok = (tok * 7 + 3) % vocab
    return ids, mask


@pytest.mark.parametrize("name", ["qwen3", "mistral-sliding"])
def test_free_running_greedy_tokens_are_identical(seen: Any, caplog: Any, name: str) -> None:
    import torch

    cfg = _configs()[name]
    state = _patterned_state(cfg)
    ours, ref = _model(cfg, "fa4cache", state=state), _model(cfg, "sdpa", state=state)
    rng = random.Random(SEED + 3)
    print(f"seed {SEED + 3}")
    ids, mask = _pattern_prompts(rng, 8, 24, cfg.vocab_size)
    for cache in ("dynamic", "static"):
        # No end-of-sequence token: the pattern passes through it, and a row that stops is
        # padded, which is no choice of the model's.
        kw: dict[str, Any] = {
            "max_new_tokens": 48, "do_sample": False, "attention_mask": mask, "eos_token_id": None,
            "pad_token_id": 0,
        }  # fmt: skip
        if cache == "static":
            kw |= {"cache_implementation": "static", "disable_compile": True}
        with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
            out = ours.generate(ids, **kw)
        want = ref.generate(ids, **kw)
        new = want[:, ids.shape[1] :]
        follows = float(((new[:, :-1] * 7 + 3) % cfg.vocab_size == new[:, 1:]).float().mean())
        assert follows > 0.9, follows  # the model's choices are real, not ties
        assert torch.equal(out, want), (cache, (out != want).sum())
    assert not [r for r in caplog.records if "runs through PyTorch" in r.getMessage()]


def test_compiled_static_cache_decoding_replays_fa4_in_cuda_graphs(seen: Any) -> None:
    # transformers compiles static-cache decoding (mode "reduce-overhead": CUDA graphs).
    # The KV-cache op is one opaque node; the graphs replay FA4 with new lengths (its Python
    # body runs far less often than once per layer and step) and the tokens are SDPA's.
    import torch

    torch._dynamo.reset()
    cfg = _configs()["qwen3"]
    state = _patterned_state(cfg)
    ours, ref = _model(cfg, "fa4cache", state=state), _model(cfg, "sdpa", state=state)
    ids, mask = _pattern_prompts(random.Random(SEED + 4), 4, 20, cfg.vocab_size)
    kw = {"max_new_tokens": 40, "do_sample": False, "attention_mask": mask, "cache_implementation": "static"}
    out = ours.generate(ids, **kw)
    steps = 40 * cfg.num_hidden_layers
    assert seen["n"] < steps / 2, (seen["n"], steps)
    want = ref.generate(ids, **{**kw, "disable_compile": True})
    assert torch.equal(out, want), (out != want).sum()


def test_a_static_cache_decode_step_captured_by_hand_replays_correctly(seen: Any) -> None:
    # One decode step of a static cache captured in a CUDA graph with FA4 inside, replayed
    # with new tokens written into its input buffers: logits as an eager dynamic-cache run.
    import torch
    from transformers import DynamicCache, StaticCache

    cfg = _configs()["llama-gqa"]
    ours, ref = _model(cfg, "fa4cache"), _model(cfg, "sdpa")
    B, P, N, L = 4, 16, 12, 64
    ids, mask = _left_padded(random.Random(SEED + 5), B, P, cfg.vocab_size)
    follow = torch.randint(0, cfg.vocab_size, (B, N), device="cuda")
    cache = StaticCache(ours.config, max_cache_len=L)
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ours(input_ids=ids, attention_mask=mask, position_ids=pos, **{cache_kwarg(): cache})
        # Static buffers: the whole cache's mask (the tokens so far, then unused slots).
        s_mask = torch.zeros(B, L, dtype=torch.long, device="cuda")
        s_mask[:, :P] = mask
        s_ids = torch.zeros(B, 1, dtype=torch.long, device="cuda")
        s_pos = torch.zeros(B, 1, dtype=torch.long, device="cuda")

        def feed(t: int) -> None:
            s_ids.copy_(follow[:, t : t + 1])
            s_mask[:, P + t] = 1
            s_pos.copy_(s_mask.sum(-1, keepdim=True) - 1)

        def step() -> Any:
            return ours(
                input_ids=s_ids, attention_mask=s_mask, position_ids=s_pos, **{cache_kwarg(): cache}
            ).logits

        got = []
        feed(0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got.append(step().clone())  # step 0 eagerly (warm-up: FA4 loads its kernel)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        feed(1)
        with torch.cuda.graph(graph):
            s_logits = step()
        calls = seen["n"]
        for t in range(1, N):
            feed(t)
            graph.replay()
            got.append(s_logits.clone())
        assert seen["n"] == calls  # replays run no Python
        dyn = DynamicCache(config=ref.config)
        want = [ref(input_ids=ids, attention_mask=mask, position_ids=pos, **{cache_kwarg(): dyn}).logits]
        m = mask
        for t in range(N):
            m = torch.cat([m, torch.ones_like(m[:, :1])], 1)
            p = m.sum(-1, keepdim=True) - 1
            want.append(
                ref(
                    input_ids=follow[:, t : t + 1], attention_mask=m, position_ids=p, **{cache_kwarg(): dyn}
                ).logits
            )
    for t in range(N):
        assert _rel(got[t], want[t + 1]) < 2e-2, (t, _rel(got[t], want[t + 1]))


def test_decoding_compiles_nothing_after_the_first_step() -> None:
    # Batch sizes and cache lengths do not reach FA4's compile key: after one generate, new
    # batch sizes, prompt lengths and lengths of output compile nothing.
    import torch
    from fa4cache.adapters import transformers as fht

    import fa4cache

    fht.register()
    store = fa4cache.install()
    cfg = _configs()["mistral-sliding"]
    model = _model(cfg, "fa4cache")
    rng = random.Random(SEED + 6)
    # Warm-up: prompts shorter and longer than the window (the packed prefill passes a
    # window only when it is shorter than the prompt: two prefill kernels).
    for length in (30, 60):
        ids, mask = _left_padded(rng, 2, length, cfg.vocab_size)
        model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    store.counters.flush()
    before = int(store.counters.values["compiles"])
    for batch, length, new in ((1, 50, 70), (16, 90, 20), (33, 17, 100)):
        ids, mask = _left_padded(rng, batch, length, cfg.vocab_size)
        model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    torch.cuda.synchronize()
    store.counters.flush()
    assert int(store.counters.values["compiles"]) == before


def test_generate_batch_on_fa4_gives_generates_tokens(seen: Any, caplog: Any) -> None:
    # Continuous batching (paged cache) with "fa4cache" ("paged|fa4cache" before 5.23), CUDA
    # graphs on where transformers decides a default for them: one FA4 varlen call per layer
    # and step, no mask; greedy tokens as generate() with SDPA gives each prompt alone.
    import torch
    from transformers import GenerationConfig

    cfg = _configs()["mistral-sliding"]
    state = _patterned_state(cfg)
    import transformers
    from packaging.version import Version

    new_transformers = Version(transformers.__version__) >= Version("5.23")
    # 5.2x deprecates the "paged|" prefix (but for paged|eager); 5.17 reads it.
    name = "fa4cache" if new_transformers else "paged|fa4cache"
    ours, ref = _model(cfg, name, state=state), _model(cfg, "sdpa", state=state)
    assert ours.config._attn_implementation in ("fa4cache", "paged|fa4cache")
    rng = random.Random(SEED + 7)
    prompts = []
    for n in (5, 33, 64, 17, 90, 2):
        tok = rng.randrange(cfg.vocab_size)
        prompts.append([(tok * 7**i + 3 * sum(7**j for j in range(i))) % cfg.vocab_size for i in range(n)])
    gen = GenerationConfig(max_new_tokens=48, do_sample=False, pad_token_id=0, eos_token_id=-1)
    replays = [0]
    real_replay = torch.cuda.CUDAGraph.replay

    def replay(self: Any) -> Any:
        replays[0] += 1
        return real_replay(self)

    torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="fa4cache.adapters.transformers"):
            out = ours.generate_batch(inputs=prompts, generation_config=gen, progress_bar=False)
    finally:
        torch.cuda.CUDAGraph.replay = real_replay  # type: ignore[method-assign]
    from transformers.generation.continuous_batching import continuous_api

    if getattr(continuous_api.resolve_continuous_batching_config, "__fa4cache__", False):
        # fa4cache.adapters.transformers.generation.graphs_by_default: CUDA graphs by default.
        assert replays[0] > 0, "continuous batching replayed no CUDA graph"
    got = [out[k].generated_tokens for k in sorted(out, key=lambda r: int(r.split("_")[-1]))]
    for p, tokens in zip(prompts, got):
        ids = torch.tensor([p], device="cuda")
        want = ref.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=0)
        want = want[0, len(p) :].tolist()
        assert tokens[:48] == want, (len(p), tokens, want)
    assert seen["n"] > 0
    assert not [r for r in caplog.records if "runs through PyTorch" in r.getMessage()]


def test_replayed_decode_launches_equal_fa4s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # fa4cache.decode.launch_plans: after the first call of a kind, a KV-cache step replays FA4's
    # launch without FA4's planning. Random decode shapes, the key count changing between
    # calls: bitwise the output FA4 planning every call gives, and FA4 planned once per kind.
    import torch

    import fa4cache
    from fa4cache.decode import kv_cache, launch, launch_plans

    fa4cache.install()
    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    rng = random.Random(SEED + 7)
    planned = {"n": 0}
    real = launch._fa4_forward

    def counting(*a: Any, **kw: Any) -> Any:
        planned["n"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(launch, "_fa4_forward", counting)
    # The unsplit call, whose launch is planned (a split call runs FA4 whole: split_kv).
    set_switch(monkeypatch, "FA4CACHE_DECODE_SPLIT", "0")
    assert launch_plans.enabled(), "this FA4's sources are not verified: no plans to test"
    for case in range(12):
        B, Hkv = rng.choice([1, 3, 32]), rng.choice([1, 2, 4])
        g, D = rng.choice([1, 4, 5]), rng.choice([64, 128])
        window = rng.choice([None, rng.randint(1, 300)])
        softcap = rng.choice([0.0, 20.0])
        launch_plans.clear()
        planned["n"] = 0
        for step in range(4):
            Tk = rng.randint(2, 3000)  # a plan is made from two key rows on
            q = torch.randn(B, Hkv * g, 1, D, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(B, Hkv, Tk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            mask = torch.ones(B, Tk, dtype=torch.long, device="cuda")
            for b in range(1, B):
                mask[b, : rng.randrange(0, Tk)] = 0
            args = (q, k, v, mask, None, True, window, D**-0.5, softcap)
            got = kv_cache.forward(*args)
            set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", "0")
            want = kv_cache.forward(*args)
            set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", None)
            assert torch.equal(got, want), (SEED, case, step, B, Hkv, g, D, Tk, window, softcap)
        # One planned call for the kind; every other planned-off call runs FA4 whole.
        assert planned["n"] == 1 + 4, (SEED, case, planned)


def test_triton_key_ranges_equal_the_pytorch_form_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from fa4cache.decode import key_ranges
    from tests.decode.test_key_ranges_triton import draw

    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    rng = random.Random(SEED + 11)
    for case in range(60):
        mask, heads_kv, keys, one_run, what = draw(rng)
        mask = mask.cuda()
        B = mask.shape[0]
        monkeypatch.setenv("FA4CACHE_TRITON", "0")
        want = key_ranges._sequences(mask, None, B, heads_kv, keys, check=False)
        monkeypatch.delenv("FA4CACHE_TRITON")
        got = key_ranges._sequences(mask, None, B, heads_kv, keys, check=False)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (SEED, case, what)


@pytest.fixture
def combines(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts split decoding's combines (one per split call run: eager, warm-up or capture)."""
    from fa4cache.decode import split_kv

    n = [0]
    real = split_kv.combine

    def counted(*a: Any) -> None:
        n[0] += 1
        real(*a)

    monkeypatch.setattr(split_kv, "combine", counted)
    return n


def test_split_decode_equals_the_unsplit_call_and_replays_in_a_graph(
    combines: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The compiled path's split decode (fa4cache/decode/split_kv.py): real FA4 over chunk
    # sequences with its LSE, and the Triton combine, against FA4's unsplit call over random
    # shapes, paddings and static buffers; then captured in a CUDA graph and replayed with
    # another padding and new keys.
    import torch

    from fa4cache.decode import choose, kv_cache

    rng = random.Random(SEED + 11)
    print(f"seed {SEED + 11}")

    def draw() -> tuple[Any, ...]:
        B, Hkv, g = rng.choice([1, 2, 3, 8]), rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8])
        D, Tk = rng.choice([64, 128]), rng.randint(1024, 6000)
        q = torch.randn(B, Hkv * g, 1, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, Hkv, Tk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        mask = torch.ones(B, Tk, dtype=torch.long, device="cuda")
        for b in range(B):
            a = rng.randint(0, Tk - 2)
            mask[b, :a] = 0
            if rng.random() < 0.5:  # a static buffer's unused slots
                mask[b, rng.randint(a + 1, Tk) :] = 0
        return q, k, v, mask, rng.choice([0.0, 30.0]), f"B={B} Hkv={Hkv} g={g} D={D} Tk={Tk}"

    def unsplit(*a: Any) -> Any:
        with monkeypatch.context() as m:
            set_switch(m, "FA4CACHE_DECODE_SPLIT", "0")
            return kv_cache.forward(*a)

    split_cases = 0
    for case in range(40):
        q, k, v, mask, softcap, what = draw()
        args = (q, k, v, mask, None, True, None, q.shape[-1] ** -0.5, softcap)
        before = combines[0]
        got, want = kv_cache.forward(*args), unsplit(*args)
        split_cases += combines[0] > before
        assert _rel(got, want) < 1e-2, (case, what, _rel(got, want))
    assert split_cases >= 20, split_cases
    # In a CUDA graph: captured once, replayed with another padding and new keys.
    q, k, v, mask, softcap, what = draw()
    while choose.split_plan(k.shape[0] * k.shape[1], k.shape[2], k.shape[-1]) is None:
        q, k, v, mask, softcap, what = draw()
    args = (q, k, v, mask, None, True, None, q.shape[-1] ** -0.5, softcap)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kv_cache.forward(*args)  # warm-up: FA4 and Triton load their kernels
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kv_cache.forward(*args)
    for _ in range(3):
        mask.fill_(1)
        mask[:, : rng.randint(0, mask.shape[1] - 2)] = 0
        k.normal_()
        graph.replay()
        assert _rel(out, unsplit(*args)) < 1e-2, what


def test_compiled_decoding_of_a_long_cache_splits_and_keeps_sdpas_tokens(
    seen: Any, combines: list[int]
) -> None:
    # Static-cache decoding compiled by transformers (CUDA graphs) over a cache past
    # decode_split.MIN_KEYS, at batch 1 and 4: the split path runs (in the graphs' capture),
    # and the greedy tokens are sdpa's.
    import torch

    torch._dynamo.reset()
    cfg = _configs()["llama-gqa"]
    state = _patterned_state(cfg)
    ours, ref = _model(cfg, "fa4cache", state=state), _model(cfg, "sdpa", state=state)
    agree = []
    for batch in (1, 4):
        ids, mask = _pattern_prompts(random.Random(SEED + 6 + batch), batch, 1100, cfg.vocab_size)
        kw = {
            "max_new_tokens": 24,
            "do_sample": False,
            "attention_mask": mask,
            "cache_implementation": "static",
        }
        out = ours.generate(ids, **kw)
        want = ref.generate(ids, **{**kw, "disable_compile": True})
        agree.append(float((out[:, ids.shape[1] :] == want[:, ids.shape[1] :]).float().mean()))
    print(f"token agreement with sdpa at batch 1 and 4: {agree}")
    assert combines[0] > 0
    assert min(agree) >= 0.9, agree
