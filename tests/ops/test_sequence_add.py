"""The backward's row-restricted add (fa4cache/ops/sequence_add.py): the Triton kernel (run on
the CPU through Triton's interpreter, in a subprocess because the interpreter is chosen at
import) and the PyTorch form both equal a brute-force loop over the sequences, on random
layouts: empty sequences, a capacity tail repeating the total, ``seqused`` shorter than the
sequence, strided tensors, head dims that are not a power of two, GQA-sized head counts.
Rows outside every sequence hold nan in ``src``: reading one would show. (The GPU run of
the kernel is covered by the GPU fuzz test's prefix-LM gradients.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CODE = r"""
import os, random, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from fa4cache.ops import sequence_add as sa
from tests.ops.test_sequence_add import draw, brute

seed = int(sys.argv[1])
rng = random.Random(seed)
for case in range(int(sys.argv[2])):
    dst, src, cu, used, what = draw(rng)
    want = brute(dst, src, cu, used)
    got = dst.clone()
    sa._launch(got, src, cu, used)
    if got.dtype == torch.float32:
        assert torch.equal(got, want), f"seed {seed} case {case}: {what}"
        continue
    # Triton's interpreter truncates float32 -> bfloat16 where the GPU rounds to nearest
    # even: inside rows may differ by one bf16 step, outside rows not at all.
    inside = ~src[:, 0, 0].isnan()
    assert torch.equal(got[~inside], want[~inside]), f"seed {seed} case {case}: {what}"
    exact = dst[inside].float() + src[inside].float()
    step = exact.abs().clamp(min=1e-30) * 2.0**-7
    assert bool(((got[inside].float() - exact).abs() <= step).all()), f"seed {seed} case {case}: {what}"
print("ok")
"""


def draw(rng):  # type: ignore[no-untyped-def]
    """A random (dst, src, cu_seqlens, seqused, description): src is nan outside the rows."""
    import torch

    n = rng.randint(1, 400)
    cuts = sorted(rng.randint(0, n) for _ in range(rng.randint(0, 6)))
    cu = [rng.choice([0, 0, 0, rng.randint(0, min(5, n))])] + cuts + [n]
    cu = sorted(cu) + [n] * rng.randint(0, 3)  # the capacity tail
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    used = [rng.randint(0, x) for x in lengths] if rng.random() < 0.6 else None
    heads = rng.choice([1, 2, 3, 4])
    dim = rng.choice([8, 64, 96, 128, 192])
    dtype = rng.choice([torch.float32, torch.bfloat16])
    layout = rng.choice(["contiguous", "heads-major", "strided rows"])

    def make():  # type: ignore[no-untyped-def]
        if layout == "heads-major":
            return torch.randn(heads, n, dim).to(dtype).transpose(0, 1)
        if layout == "strided rows":
            return torch.randn(2 * n, heads, dim).to(dtype)[::2]
        return torch.randn(n, heads, dim).to(dtype)

    dst, src = make(), make()
    inside = torch.zeros(n, dtype=torch.bool)
    for i, length in enumerate(lengths):
        inside[cu[i] : cu[i] + (length if used is None else used[i])] = True
    src[~inside] = float("nan")
    cu_t = torch.tensor(cu, dtype=rng.choice([torch.int32, torch.int64]))
    if rng.random() < 0.3:  # a strided view, as a slice of a larger tensor gives
        cu_t = torch.stack([cu_t, cu_t], 1)[:, 0]
    used_t = None if used is None else torch.tensor(used, dtype=torch.int32)
    return dst, src, cu_t, used_t, f"n={n} cu={cu} used={used} heads={heads} dim={dim} {dtype} {layout}"


def brute(dst, src, cu, used):  # type: ignore[no-untyped-def]
    out = dst.clone()
    for i in range(cu.numel() - 1):
        a = int(cu[i])
        b = a + (int(cu[i + 1]) - a if used is None else int(used[i]))
        out[a:b] = (out[a:b].float() + src[a:b].float()).to(out.dtype)
    return out


BASE_SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", "0"))


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0, 1])
def test_triton_kernel_adds_exactly_the_sequence_rows(offset: int) -> None:
    pytest.importorskip("triton")
    seed = BASE_SEED + offset
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", CODE, str(seed), "25"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, f"FA4CACHE_FUZZ_SEED={BASE_SEED} (seed {seed}):\n{p.stderr[-3000:]}"
    assert p.stdout.strip().endswith("ok")


# draw() gives strided cu_seqlens too: the form must not hand those to searchsorted as they are.
@pytest.mark.filterwarnings("error:torch.searchsorted.*non-contiguous:UserWarning")
def test_torch_form_adds_exactly_the_sequence_rows() -> None:
    import random

    import torch

    from fa4cache.ops.sequence_add import add_sequences_

    rng = random.Random(BASE_SEED)
    for case in range(40):
        dst, src, cu, used, what = draw(rng)
        want = brute(dst, src, cu, used)
        got = add_sequences_(dst.clone(), src, cu, used)
        assert torch.equal(got, want), f"FA4CACHE_FUZZ_SEED={BASE_SEED} case {case}: {what}"


def test_fake_cuda_tensors_pass_through() -> None:
    # The cross-compiler runs the backward on fake CUDA tensors on a CPU-only torch.
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4cache.ops.sequence_add import add_sequences_

    with FakeTensorMode():
        dst = torch.empty(100, 4, 64, device="cuda", dtype=torch.bfloat16)
        cu = torch.empty(3, device="cuda", dtype=torch.int32)
        out = add_sequences_(dst, torch.empty_like(dst), cu, torch.empty(2, device="cuda", dtype=torch.int32))
    assert out is dst and out.shape == (100, 4, 64)


def test_bad_input_names_the_argument() -> None:
    import torch

    from fa4cache.ops.sequence_add import add_sequences_

    x = torch.zeros(10, 2, 8)
    with pytest.raises(ValueError, match="src: shape"):
        add_sequences_(x, torch.zeros(10, 2, 4), torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="cu_seqlens: expected a 1-D tensor"):
        add_sequences_(x, x, torch.tensor([0]))
