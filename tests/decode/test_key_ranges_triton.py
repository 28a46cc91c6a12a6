"""A decode step's key ranges in one Triton launch (fa4cache/decode/key_ranges_triton.py) equal
the PyTorch form's (fa4cache.decode.key_ranges._sequences) on random masks: left padding, empty
rows, masks wider and narrower than the keys, long/bool/int masks, strided views, 1 to 9
KV heads; a mask that is not one run per row is refused by both. Run on the CPU through
Triton's interpreter, in a subprocess (the interpreter is chosen at import). The GPU run is
tests/adapters/transformers/test_generation_gpu.py's."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CODE = r"""
import os, random, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from fa4cache.decode import key_ranges
from tests.decode.test_key_ranges_triton import draw

seed = int(sys.argv[1])
rng = random.Random(seed)
refused = 0
for case in range(int(sys.argv[2])):
    mask, heads_kv, keys, one_run, what = draw(rng)
    batch = mask.shape[0]
    if not one_run:
        for form in ("torch", "triton"):
            try:
                if form == "torch":
                    key_ranges._sequences(mask, None, batch, heads_kv, keys)
                else:
                    key_ranges.key_ranges_triton(mask, batch, heads_kv, keys)
            except RuntimeError as e:
                assert "one run of tokens" in str(e), (seed, case, what, e)
            else:
                raise AssertionError(f"seed {seed} case {case}: {form} took {what}")
        refused += 1
        continue
    want = key_ranges._sequences(mask, None, batch, heads_kv, keys)
    for check in (True, False):
        got = key_ranges.key_ranges_triton(mask, batch, heads_kv, keys, check=check)
        for g, w, name in zip(got, want, ("cu_seqlens_k", "seqused_k")):
            assert g.dtype == torch.int32 and g.is_contiguous(), (seed, case, name)
            assert torch.equal(g, w), f"seed {seed} case {case}: {what}: {name} {g.tolist()} != {w.tolist()}"
assert refused > 0, "no bad mask drawn"
print("ok")
"""


def draw(rng):  # type: ignore[no-untyped-def]
    """(mask, heads_kv, keys, one run per row?, description)."""
    import torch

    batch = rng.choice([1, 2, 3, 8, 33])
    width = rng.choice([1, 5, 64, 777, 1024, 1025, 2500])
    keys = rng.choice([width, width, width + rng.randint(1, 300), max(1, width - rng.randint(0, width - 1))])
    heads_kv = rng.randint(1, 9)
    rows = []
    one_run = True
    for _ in range(batch):
        row = torch.zeros(width, dtype=torch.bool)
        kind = rng.choice(
            ["left", "left", "full", "empty", "both", "gap"] if rng.random() < 0.3 else ["left", "full"]
        )
        start = rng.randint(0, width)
        end = width if kind in ("left", "full") else rng.randint(start, width)
        if kind == "full":
            start = 0
        if kind != "empty":
            row[start:end] = True
        if kind == "gap" and end - start >= 3:
            row[rng.randint(start + 1, end - 2)] = False
            one_run = False
        rows.append(row)
    mask = torch.stack(rows)
    dtype = rng.choice([torch.long, torch.bool, torch.int32])
    mask = mask.to(dtype)
    if rng.random() < 0.3:  # a strided view (a slice of a wider mask)
        wide = torch.zeros(batch, width * 2, dtype=dtype)
        wide[:, 1::2] = mask
        mask = wide[:, 1::2]
    return mask, heads_kv, keys, one_run, f"B={batch} width={width} keys={keys} heads_kv={heads_kv} {dtype}"


BASE_SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))


@pytest.mark.slow
def test_triton_key_ranges_equal_the_pytorch_form() -> None:
    pytest.importorskip("triton")
    print(f"FA4CACHE_FUZZ_SEED={BASE_SEED}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", CODE, str(BASE_SEED), "60"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, f"FA4CACHE_FUZZ_SEED={BASE_SEED}:\n{p.stderr[-3000:]}"
    assert p.stdout.strip().endswith("ok")
