"""A decode layer's host-side shortcuts against the general forms they stand for: the single
query view at one query (fa4cache.decode.kv_cache._query_view), the step-lengths sharing check
(fa4cache.decode.step_ranges._shareable), and the first-layer-of-its-kind answer kept per module
(fa4cache.adapters.transformers.generation.first_of_its_kind)."""

from __future__ import annotations

import os
import random
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fa4cache.decode import kv_cache, step_ranges  # noqa: E402

SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))


def _chain(query: Any, B: int, Hkv: int, g: int, Tq: int, D: int) -> Any:
    return query.view(B, Hkv, g, Tq, D).transpose(2, 3).reshape(B * Hkv, Tq, g, D)


def _layout(rng: random.Random, shape: list[int]) -> Any:
    kind = rng.choice(["transformers", "permuted", "expanded", "strided"])
    if kind == "transformers":  # [B, Tq, Hq, D] transposed, as the model hands it
        return torch.randn(shape[0], shape[2], shape[1], shape[3]).transpose(1, 2)
    if kind == "permuted":
        perm = list(range(4))
        rng.shuffle(perm)
        return torch.randn([shape[p] for p in perm]).permute(*[perm.index(i) for i in range(4)])
    if kind == "expanded":
        return torch.randn([x if rng.random() < 0.6 else 1 for x in shape]).expand(*shape)
    strides = [rng.choice([0, 1, 2, 3, 5, 8, 16, 64]) for _ in range(4)]
    return torch.randn(8192).as_strided(shape, strides, rng.choice([0, 1, 3]))


def test_the_single_query_view_is_the_general_form() -> None:
    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    rng = random.Random(SEED)
    viewed = 0
    for case in range(3000):
        B, Hkv, g, D = (
            rng.choice([1, 2, 3]),
            rng.choice([1, 2, 4]),
            rng.choice([1, 2, 3, 4]),
            rng.choice([1, 4, 8]),
        )
        Tq = 1 if rng.random() < 0.8 else rng.choice([2, 3])
        q = _layout(rng, [B, Hkv * g, Tq, D])
        got, want = kv_cache._query_view(q, B, Hkv, g, Tq, D), _chain(q, B, Hkv, g, Tq, D)
        where = f"seed {SEED} case {case}: shape {list(q.shape)} strides {q.stride()}"
        assert torch.equal(got, want), where
        assert (got.stride(), got.storage_offset()) == (want.stride(), want.storage_offset()), where
        assert torch._C._is_alias_of(got, q) == torch._C._is_alias_of(want, q), where
        viewed += Tq == 1 and torch._C._is_alias_of(got, q)
    assert viewed > 500  # the view itself, not only its fallback, was tried


def test_step_lengths_are_not_kept_while_a_cuda_graph_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        src = torch.empty(2, 8, device="cuda")  # a CUDA tensor without a GPU
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert step_ranges._shareable(src)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not step_ranges._shareable(src)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not step_ranges._shareable(src)


class _Layer(torch.nn.Module):
    def __init__(self, idx: Any, config: Any) -> None:
        super().__init__()
        self.layer_idx = idx
        self.config = config


def _fresh() -> Any:
    from fa4cache.adapters.transformers import generation

    generation._first.clear()
    return generation


def test_first_of_its_kind_follows_the_layer_and_its_config() -> None:
    generation = _fresh()
    first = generation.first_of_its_kind
    cfg = SimpleNamespace(layer_types=["full", "sliding", "full", "sliding"])
    layer = _Layer(2, cfg)
    assert not first(layer) and not first(layer)  # the second from the memo
    layer.layer_idx = 1  # the layer renumbered
    assert first(layer)
    layer.config = SimpleNamespace(layer_types=["sliding", "sliding", "full", "full"])  # replaced
    assert not first(layer)
    layer.config.layer_types = ["full", "sliding", "full", "full"]  # reassigned on the same config
    assert first(layer)
    layer.layer_idx = 3
    layer.config.layer_types = None  # no types: the first layer only
    assert not first(layer)
    assert first(_Layer(0, SimpleNamespace()))
    assert first(SimpleNamespace(layer_idx=0, config=None))  # no weak reference to it: not kept
    assert not first(SimpleNamespace(layer_idx=5, config=None))


def test_a_freed_layer_does_not_lend_its_answer_to_a_new_one() -> None:
    # A new layer may get a freed one's id: the freed layer's entry, everything else alike
    # (index, config, types), is found under it and must not answer for it.
    generation = _fresh()
    cfg = SimpleNamespace(layer_types=["full", "sliding"])
    old = _Layer(1, cfg)
    dead = weakref.ref(old)
    del old
    assert dead() is None
    new = _Layer(1, cfg)
    generation._first[id(new)] = (dead, 1, cfg, cfg.layer_types, False)
    assert generation.first_of_its_kind(new)


def test_first_of_its_kind_keeps_nothing_while_torch_compile_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    generation = _fresh()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    layer = _Layer(0, SimpleNamespace(layer_types=["full"]))
    assert generation.first_of_its_kind(layer)
    assert not generation._first  # a guard on the memo would recompile the model when it changes


def test_a_decode_step_traced_as_a_frame_of_its_own_goes_through_the_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # After a graph break dynamo may run the adapter's entry eagerly and trace _decode_step as
    # a frame of its own: it must ask whether it is traced itself (the op, opaque to the
    # tracer), not take the eager caller's answer (FA4's Python and the module memo, traced).
    from fa4cache.adapters.transformers import attention

    gen = _fresh()
    used = []
    monkeypatch.setattr(gen.decode_op, "op", lambda: lambda *a: used.append("op") or "op")
    monkeypatch.setattr(gen.kv_cache, "forward", lambda *a, **k: used.append("forward") or "forward")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    layer = _Layer(0, SimpleNamespace(layer_types=["full"]))
    q = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 5, 8, dtype=torch.bfloat16)
    mask = torch.ones(1, 5, dtype=torch.long)
    out = attention._decode_step(layer, q, k, k, mask, 0.0, None, None, None, None, {})
    assert out == "op" and used == ["op"]
    assert not gen._first  # nothing kept while traced
