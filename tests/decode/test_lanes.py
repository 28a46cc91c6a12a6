"""Decode lanes (fa4cache/decode/lanes.py ``_Lane``): a decode layer's FA4 launch taken from
the step's last replayed call of its kind instead of its launch family's lookups.

FA4 is a stand-in here whose compile cache holds kernels that compute FA4's CPU model
(tests/helpers/fa4_varlen_model.py) from the arguments they are given, so that launch
plans are made, observed and replayed on CPU tensors as on the GPU: a call launched with
another call's scalars or key ranges gives another result. Random decode steps (layers of
two kinds, fresh tensors per layer, masks changed in place, layouts, dtypes and aliasing
that change between layers; the seed is printed) are held to a dense reference, and what
must not be served from a lane is not: FA4's state changed, plans off, another compile
cache, a traced call.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")
fi = pytest.importorskip("flash_attn.cute.interface")

from fa4cache.decode import key_ranges, kv_cache, lanes, launch, plan, step_ranges  # noqa: E402
from fa4cache.decode import launch_plans as lp  # noqa: E402
from tests.helpers import fa4_varlen_model  # noqa: E402
from tests.helpers.switches import set_switch  # noqa: E402

SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))


def _kernel(q: Any, k: Any, v: Any, out: Any, cu: Any, used: Any, *scalars: Any) -> None:
    scale, causal, softcap, left, right = scalars
    got, _ = fa4_varlen_model.flash_attn_fwd(
        q, k, v, cu_seqlens_k=cu, seqused_k=used, softmax_scale=scale, causal=causal, softcap=softcap,
        window_size_left=left, window_size_right=right,
    )  # fmt: skip
    out.copy_(got)


class Kernels:
    """A compile cache (FA4's ``compile_cache`` interface, its kernels in ``.cache``)."""

    def __init__(self) -> None:
        self.cache: dict[Any, Any] = {}

    def __contains__(self, key: Any) -> bool:
        return key in self.cache

    def __getitem__(self, key: Any) -> Any:
        return self.cache[key]

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.cache[key] = fn


class Counts:
    def __init__(self) -> None:
        self.whole = 0  # FA4 run whole (planned by FA4)
        self.lane = 0  # launched from a lane
        self.wrong: list[str] = []  # lane launches whose family or key ranges were not the call's own


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    """FA4's forward as a stand-in that keys a kernel on what FA4 keys on (and its state) and
    calls it with the call's tensors and scalars; CPU tensors planned as CUDA ones are."""
    c = Counts()

    def whole(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        c.whole += 1
        key = (q.dtype, q.shape[-1], v.shape[-1], q.shape[2], kw["causal"], bool(kw["softcap"]),
               kw["window_size_left"] is not None, plan.fa4_settings(fi))  # fmt: skip
        cache = fi._flash_attn_fwd.compile_cache
        if key not in cache:
            cache[key] = _kernel
        out = kw["out"]
        cache[key](q, k, v, out, kw["cu_seqlens_k"], kw["seqused_k"], kw["softmax_scale"], kw["causal"],
                   kw["softcap"], kw["window_size_left"], kw["window_size_right"])  # fmt: skip
        return out

    # The oracle: a lane's launch must be the launch family it was made from (launch_plans.family
    # of the tensors it launches now), with the key ranges computed afresh for the call's mask.
    made_from: dict[int, tuple[Any, ...]] = {}
    last: dict[str, Any] = {}
    real_replay, real_keep, real_serves = launch.launch_replay, lanes._keep_lane, lanes._Lane.serves
    real_launch = lanes._Lane.launch

    def launch_replay(run_whole: Any, tensors: Any, scalars: Any, keys: int) -> Any:
        last["family"] = plan.family(fi, tensors, scalars)
        return real_replay(run_whole, tensors, scalars, keys)

    def keep(window: Any, *a: Any) -> None:
        real_keep(window, *a)
        if window in lanes._lanes:
            made_from[id(lanes._lanes[window])] = last["family"]

    def serves(self: Any, query: Any, k: Any, v: Any, out: Any, mask: Any, pos: Any, *a: Any) -> bool:
        last["src"] = (mask, pos)
        return real_serves(self, query, k, v, out, mask, pos, *a)

    def lane_launch(self: Any, q: Any, k: Any, v: Any, out: Any) -> None:
        c.lane += 1
        if plan.family(fi, (q, k, v, out, self.cu, self.used), self.inputs[-1]) != made_from[id(self)]:
            c.wrong.append(f"family: {[tuple(t.shape) for t in (q, k, v, out)]}")
        B, Hkv, Tk = self.inputs[1][0], self.inputs[7][1], self.inputs[7][2]
        cu, used = key_ranges._sequences(*last["src"], B, Hkv, Tk, check=False)
        if not (torch.equal(cu, self.cu) and torch.equal(used, self.used)):
            c.wrong.append(f"key ranges: {self.used.tolist()} for {used.tolist()}")
        real_launch(self, q, k, v, out)

    monkeypatch.setattr(launch, "launch_replay", launch_replay)
    monkeypatch.setattr(lanes, "_keep_lane", keep)
    monkeypatch.setattr(lanes._Lane, "serves", serves)

    monkeypatch.setattr(fi._flash_attn_fwd, "compile_cache", Kernels())
    monkeypatch.setattr(launch, "_fa4_forward", whole)
    monkeypatch.setattr(lanes._Lane, "launch", lane_launch)
    tensor = torch.Tensor
    monkeypatch.setattr(
        launch, "_plain", lambda ts: all(type(t) is tensor and not t.requires_grad for t in ts)
    )
    monkeypatch.setattr(lp, "_verified", [True])
    lp.clear()
    lanes._lanes.clear()
    step_ranges._step.clear()
    yield c
    lp.clear()
    lanes._lanes.clear()
    step_ranges._step.clear()


def _query(usual: bool, B: int, Hq: int, D: int, dtype: Any, Tq: int = 1) -> Any:
    if usual:  # transformers' layout: [B, Tq, Hq, D] transposed
        return torch.randn(B, Tq, Hq, D, dtype=dtype).transpose(1, 2)
    return torch.randn(B, Hq, Tq, D, dtype=dtype)


def _cache(usual: bool, B: int, Hkv: int, Tk: int, D: int, dtype: Any) -> Any:
    if usual:
        return torch.randn(B, Hkv, Tk, D, dtype=dtype)
    # A slice of a longer buffer: its reshape copies (another layout of FA4's keys)
    return torch.randn(B, Hkv, Tk + 3, D, dtype=dtype)[:, :, :Tk]


def test_decode_steps_through_lanes_match_a_dense_reference(
    counts: Counts, monkeypatch: pytest.MonkeyPatch
) -> None:
    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    rng = random.Random(SEED)
    events: dict[str, int] = {}
    calls = 0
    for trial in range(12):
        B, Hkv, g, D = rng.choice([1, 2, 3]), rng.choice([1, 2]), rng.choice([1, 2, 4]), rng.choice([8, 16])
        kinds = [None] if rng.random() < 0.5 else [None, rng.choice([1, 3])]  # full, and sliding layers
        layers, dtype = rng.randint(3, 6), rng.choice([torch.float32, torch.float64])
        use_mask = rng.random() < 0.8
        mask_dtype = rng.choice([torch.long, torch.bool])
        layout = [rng.random() < 0.7, rng.random() < 0.7]  # the model's query and cache layouts
        pads = [rng.randint(0, 3) if b else 0 for b in range(B)]
        L = rng.randint(5, 9)
        for step in range(4):
            L += 1
            mask = torch.ones(B, L, dtype=mask_dtype)
            for b, p in enumerate(pads):
                mask[b, :p] = 0
            pos = (mask.sum(-1, keepdim=True) - 1) if rng.random() < 0.5 else torch.tensor([[L - 1]])
            seen_kinds: set[Any] = set()
            for layer in range(layers):
                window = kinds[layer % len(kinds)]
                q_dtype = dtype
                event = rng.choices(
                    ["none", "mask", "dtype", "alias", "settings", "scale", "layout", "prefill"],
                    [20, 1, 1, 1, 1, 1, 1, 1],
                )[0]
                events[event] = events.get(event, 0) + 1
                if event == "mask" and use_mask:  # the step's mask changed in place between layers
                    b = rng.randrange(B)
                    pads[b] = min(pads[b] + rng.randint(1, 2), L - 2)
                    mask[b, : pads[b]] = 0
                if event == "dtype":
                    q_dtype = torch.float64 if dtype == torch.float32 else torch.float32
                if event == "settings":  # another SM count than the one in force
                    sms = os.environ.get("FLASH_ATTENTION_NUM_SMS")
                    monkeypatch.setenv("FLASH_ATTENTION_NUM_SMS", "100" if sms != "100" else "132")
                scale = D**-0.5 * (0.5 if event == "scale" else 1.0)
                usual = [u != (event == "layout" and rng.random() < 0.5) for u in layout]
                # A prefill into the cache: a few queries, the last slots of each row's run.
                Tq = min(3, L - 1 - max(pads)) if event == "prefill" else 1
                query = _query(usual[0], B, Hkv * g, D, q_dtype, max(Tq, 1))
                key = _cache(usual[1], B, Hkv, L, D, q_dtype)
                value = key if event == "alias" else _cache(usual[1], B, Hkv, L, D, q_dtype)
                check = window not in seen_kinds
                seen_kinds.add(window)
                given = mask if use_mask else None
                out = kv_cache.forward(
                    query, key, value, given, pos, True, window, scale, 0.0, check, share=True
                )
                want = fa4_varlen_model.kv_cache_reference(query, key, value, given, pos, True, window, scale)
                where = f"seed {SEED} trial {trial} step {step} layer {layer} ({event})"
                torch.testing.assert_close(
                    out.double(), want.double(), atol=1e-5, rtol=1e-5, msg=lambda m, w=where: f"{w}: {m}"
                )
                calls += 1
    print(events, f"calls {calls}, from lanes {counts.lane}, FA4 whole {counts.whole}")
    assert not counts.wrong, counts.wrong[:5]
    assert counts.lane > calls // 5  # the lanes served, not only the families behind them


def _layer_call(query: Any, key: Any, value: Any, mask: Any, check: bool = False) -> Any:
    return kv_cache.forward(query, key, value, mask, None, True, None, 0.25, 0.0, check, share=True)


def _step_tensors(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 1, 4, 16, generator=gen).transpose(1, 2)
    key, value = (torch.randn(2, 2, 9, 16, generator=gen) for _ in range(2))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    return query, key, value, mask


def _with_lane(counts: Counts) -> tuple[Any, Any, Any, Any]:
    """Three layers of one step: FA4 plans the first, the second is replayed (and leaves a
    lane), the third comes from the lane."""
    query, key, value, mask = _step_tensors()
    _layer_call(query, key, value, mask, check=True)
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    before = counts.lane
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert counts.lane == before + 1
    return query, key, value, mask


def test_fa4_state_changed_between_layers_is_planned_by_fa4(
    counts: Counts, monkeypatch: pytest.MonkeyPatch
) -> None:
    query, key, value, mask = _with_lane(counts)
    lane, whole = counts.lane, counts.whole
    monkeypatch.setattr(
        fi.utils, "_fa_disable_s_ping_pong_enabled", not fi.utils._fa_disable_s_ping_pong_enabled
    )
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert (counts.lane, counts.whole) == (lane, whole + 1)


def test_plans_turned_off_between_layers_run_fa4_whole(
    counts: Counts, monkeypatch: pytest.MonkeyPatch
) -> None:
    query, key, value, mask = _with_lane(counts)
    lane, whole = counts.lane, counts.whole
    set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", "0")
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert (counts.lane, counts.whole) == (lane, whole + 1)


def test_another_compile_cache_is_not_launched_from_a_lane(
    counts: Counts, monkeypatch: pytest.MonkeyPatch
) -> None:
    query, key, value, mask = _with_lane(counts)
    lane, whole = counts.lane, counts.whole
    monkeypatch.setattr(fi._flash_attn_fwd, "compile_cache", Kernels())  # an install() of another store
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert (counts.lane, counts.whole) == (lane, whole + 1)


def test_a_traced_call_is_not_launched_from_a_lane(counts: Counts, monkeypatch: pytest.MonkeyPatch) -> None:
    query, key, value, mask = _with_lane(counts)
    lane = counts.lane
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert counts.lane == lane


def test_a_mask_changed_in_place_is_read_again(counts: Counts) -> None:
    query, key, value, mask = _with_lane(counts)
    lane = counts.lane
    mask[0, :5] = 0
    q, k, v = query.clone(), key.clone(), value.clone()
    got = _layer_call(q, k, v, mask)  # not a first layer: no check asked for
    assert counts.lane == lane
    want = fa4_varlen_model.kv_cache_reference(q, k, v, mask, None, True, None, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_first_layer_check_is_not_skipped_by_an_unchecked_lane(counts: Counts) -> None:
    query, key, value, mask = _step_tensors()
    _layer_call(query, key, value, mask, check=False)
    _layer_call(query.clone(), key.clone(), value.clone(), mask, check=False)  # leaves an unchecked lane
    lane = counts.lane
    _layer_call(query.clone(), key.clone(), value.clone(), mask, check=True)
    assert counts.lane == lane
    _layer_call(query.clone(), key.clone(), value.clone(), mask, check=False)  # the checked lane now serves
    assert counts.lane == lane + 1


def test_keys_that_are_the_values_are_not_launched_from_a_lane(counts: Counts) -> None:
    query, key, value, mask = _with_lane(counts)
    lane = counts.lane
    k = key.clone()
    got = _layer_call(query.clone(), k, k, mask)
    assert counts.lane == lane
    want = fa4_varlen_model.kv_cache_reference(query, k, k, mask, None, True, None, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_inputs_that_need_a_gradient_leave_no_lane(counts: Counts) -> None:
    # Under no_grad a copy of such an input needs no gradient, under enable_grad it does: FA4
    # plans those two calls differently, and the inputs alone do not tell them apart.
    query, key, value, mask = _step_tensors()
    key, value = (torch.randn(2, 2, 12, 16)[:, :, :9].requires_grad_() for _ in range(2))  # reshape copies
    with torch.no_grad():
        for _ in range(3):
            _layer_call(query.clone(), key, value, mask)
    assert counts.lane == 0 and not lanes._lanes
    with torch.enable_grad():
        _layer_call(query.clone(), key, value, mask)
    assert counts.lane == 0


def test_a_compile_cache_cleared_in_place_is_planned_again(counts: Counts) -> None:
    query, key, value, mask = _with_lane(counts)
    lane, whole = counts.lane, counts.whole
    fi._flash_attn_fwd.compile_cache.cache.clear()
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert (counts.lane, counts.whole) == (lane, whole + 1)


def test_forgotten_plans_are_planned_again(counts: Counts) -> None:
    query, key, value, mask = _with_lane(counts)
    lane, whole = counts.lane, counts.whole
    lp.clear()
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert (counts.lane, counts.whole) == (lane, whole + 1)


def test_decoding_under_inference_mode_shares_nothing(counts: Counts) -> None:
    # Inference tensors have no version counter: a mask changed in place could not be seen.
    with torch.inference_mode():
        query, key, value, mask = _step_tensors()
        outs = [_layer_call(query, key, value, mask, check=True)]
        mask[0, :4] = 0
        outs.append(_layer_call(query, key, value, mask))
    assert counts.lane == 0 and not lanes._lanes and not step_ranges._step
    want = fa4_varlen_model.kv_cache_reference(query, key, value, mask, None, True, None, 0.25)
    torch.testing.assert_close(outs[1], want, atol=1e-5, rtol=1e-5)


def test_a_compile_cache_given_new_kernels_is_planned_again(counts: Counts) -> None:
    query, key, value, mask = _with_lane(counts)
    lane, whole = counts.lane, counts.whole
    old = fi._flash_attn_fwd.compile_cache.cache
    fi._flash_attn_fwd.compile_cache.cache = {
        ("another", i): _kernel for i in range(len(old))
    }  # as many, others
    _layer_call(query.clone(), key.clone(), value.clone(), mask)
    assert (counts.lane, counts.whole) == (lane, whole + 1)
