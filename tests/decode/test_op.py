"""The decode path's custom ops (fa4cache/decode/op.py): registered once, their shape functions
the shapes their bodies return (what torch.compile plans the graph with), and their bodies
the eager calls (fa4cache.decode.kv_cache.forward, fa4cache.decode.paged.varlen_forward)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fa4cache.decode import kv_cache, launch, op, paged  # noqa: E402
from tests.helpers import fa4_varlen_model  # noqa: E402


@pytest.fixture
def fa4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_fa4_forward", lambda *a, **kw: fa4_varlen_model.flash_attn_fwd(*a, **kw)[0])


def test_the_ops_shape_functions_give_their_bodies_shapes(fa4: None) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert op.op() is op.op() is torch.ops.fa4cache.kv_cache_attention  # registered once
    assert op.varlen_op() is torch.ops.fa4cache.varlen_kv_attention
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 8, 3, 16, generator=gen)
    key, value = torch.randn(2, 2, 9, 16, generator=gen), torch.randn(2, 2, 9, 32, generator=gen)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    args = (query, key, value, mask, None, True, None, 0.25, 0.0)
    got = op.op()(*args)
    torch.testing.assert_close(got, kv_cache.forward(*args))
    assert tuple(got.shape) == (2, 3, 8, 32)
    cu_q = torch.tensor([0, 1, 3], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    vargs = (query[:1], key[:1], value[:1], cu_q, cu_k, 2, 5, True, None, 0.25, 0.0)
    vgot = op.varlen_op()(*vargs)
    torch.testing.assert_close(vgot, paged.varlen_forward(*vargs))
    with FakeTensorMode() as mode:
        fake = op.op()(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        vfake = op.varlen_op()(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in vargs))
    assert (fake.shape, fake.stride()) == (got.shape, got.stride())
    assert vfake.shape == vgot.shape


def test_a_decode_steps_op_output_has_the_strides_its_shape_function_promises(fa4: None) -> None:
    # At one query FA4 writes the [B, 1, Hq, Dv] result itself; the shape function's result
    # must be laid out the same (a compiled graph reads it by those strides).
    from torch._subclasses.fake_tensor import FakeTensorMode

    query = torch.randn(3, 4, 1, 8)
    key = torch.randn(3, 2, 6, 8)
    args: tuple[Any, ...] = (query, key, key, torch.ones(3, 6, dtype=torch.long), None, True, None, 0.3, 0.0)
    got = op.op()(*args)
    with FakeTensorMode() as mode:
        fake = op.op()(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert (
        (tuple(fake.shape), fake.stride())
        == (tuple(got.shape), got.stride())
        == ((3, 1, 4, 8), (32, 32, 8, 1))
    )
