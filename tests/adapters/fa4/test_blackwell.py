"""Blackwell (sm_100 / sm_103) readiness, proven by cross-compiling on the CPU.

Real FA4 compiles for sm_100 in separate processes (FA4 reads its target arch at import);
what cannot be checked here is the kernels' run-time output (no Blackwell GPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_cli, worker_env


def _in_arch(arch: str, code: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = worker_env(cache, **env)
    e["FLASH_ATTENTION_ARCH"] = arch
    e["CUTE_DSL_ARCH"] = arch + "a"
    e.pop("FLASH_ATTENTION_NUM_SMS", None)
    e.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True, timeout=900
    )


TILES = r"""
import json, torch
from fa4cache.masks import make_document_mask, make_draft_block_mask
m = make_document_mask(torch.tensor([0, 700, 1000]))
d = make_draft_block_mask(torch.tensor([[3, 9]]), context_len=20, draft_block_size=8)
try:
    make_document_mask(torch.tensor([0, 1000]), sparse_tile=(128, 128))
    err = None
except ValueError as e:
    err = str(e)
print("RESULT", json.dumps({"fwd": m.block_sparse_tensors.block_size, "bwd": m.block_sparse_tensors_bwd.block_size,
                            "draft": d.block_sparse_tensors.block_size, "error": err}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "fwd", "bwd"),
    [
        ("sm_90", [128, 128], [128, 128]),
        ("sm_100", [256, 128], [128, 256]),
        ("sm_103", [256, 128], [128, 256]),
    ],
)
def test_default_tiles_per_arch_and_the_error_for_a_wrong_one(
    tmp_path: Path, arch: str, fwd: list[int], bwd: list[int]
) -> None:
    p = _in_arch(arch, TILES, tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.split("RESULT", 1)[1])
    assert r["fwd"] == fwd and r["bwd"] == bwd and r["draft"] == fwd
    if arch == "sm_90":
        assert r["error"] is None
    else:
        assert r["error"].startswith("sparse_tile: FA4 on sm_10") and "multiple of 256" in r["error"]
        assert "default (256, 128)" in r["error"]


FA4_REJECTS = r"""
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from fa4cache.masks.blocksparse import block_sparse_tensors
from fa4cache.masks import make_document_mask
from fa4cache.adapters.compile.warm_specs import fake_copy
from flash_attn.cute import interface as fi
import dataclasses
m = make_document_mask(torch.tensor([0, 700, 1000]), block_sparse=False)
fwd, _ = block_sparse_tensors(*m.intervals, seqlen_q=1000, seqlen_k=1000, block_size=(128, 128))
m = dataclasses.replace(m, block_sparse_tensors=fwd, block_sparse_tensors_bwd=fwd)
with FakeTensorMode():
    f = fake_copy(m)
    q = torch.empty(1, 1000, 4, 128, dtype=torch.bfloat16, device="cuda")
    try:
        fi._flash_attn_fwd(q, q, q, mask_mod=f.mask_mod, aux_tensors=f.aux_tensors, block_sparse_tensors=f.block_sparse_tensors)
    except ValueError as e:
        print("REJECTED", e)
"""


@pytest.mark.compile
def test_fa4_rejects_the_tile_the_table_rejects(tmp_path: Path) -> None:
    # The table in fa4cache/masks/tiles.py, held against FA4 itself: FA4's sm_100 forward refuses
    # a 128-row query tile, which check_tile refuses too (test above) before FA4 is called.
    p = _in_arch("sm_100", FA4_REJECTS, tmp_path, FLASH_ATTENTION_NUM_SMS="148")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "REJECTED" in p.stdout and "must be a multiple of 256" in p.stdout


def _warm(cache: Path, arch: str, *args: str, **env: str) -> dict[str, Any]:
    p = run_cli(cache, "warm", "--arch", arch, *args, env={"FLASH_ATTENTION_NUM_SMS": "", **env})
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    compiled = re.findall(r"(\d+) kernels? compiled", p.stdout)[-1]  # the summary line
    return {"compiled": int(compiled), "out": p.stdout}


# sm_100's whole default sets; sm_90's are compiled by the CLI's and the adapters' tests, so
# here one kernel of it checks the toolchain its entries are filed under (CI time: ~50 s less).
SETS = {
    "sm_100": (("--mask", "document", "--mask", "causal"), ("--mask", "document", "--heads", "16:4")),
    "sm_90": (("--mask", "causal", "--no-backward"),),
}


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_default_kernel_sets_cross_compile_publish_and_load(tmp_path: Path, arch: str) -> None:
    # sm_100: forward + backward of a document mask, plain causal, and a GQA document mask.
    cache = tmp_path / "store"
    first = [_warm(cache, arch, *args) for args in SETS[arch]]
    compiled = [w["compiled"] for w in first]
    if arch == "sm_100":
        assert compiled[0] >= 4 and compiled[1] >= 2, compiled
    else:
        assert compiled == [1], compiled
    print(f"{arch}: {sum(compiled)} kernels compiled\n" + "".join(w["out"] for w in first))
    objs = list(cache.glob("v2/*/*/*.o"))
    assert len(objs) == sum(compiled)
    (tc_dir,) = {p.parent.parent for p in objs}
    desc = json.loads((tc_dir / "toolchain.json").read_text())
    assert desc["arch"] == int(arch[3:]) and desc["num_sms"] == {"sm_90": 132, "sm_100": 148}[arch]
    # A second process compiles nothing: everything loads from the store.
    assert [_warm(cache, arch, *args)["compiled"] for args in SETS[arch]] == [0] * len(SETS[arch])


@pytest.mark.compile
def test_another_sm_count_is_another_toolchain(tmp_path: Path) -> None:
    cache = tmp_path / "store"
    _warm(cache, "sm_100", "--mask", "causal", "--no-backward")
    other = _warm(
        cache,
        "sm_100",
        "--mask",
        "causal",
        "--no-backward",
        FLASH_ATTENTION_ARCH="sm_100",
        FLASH_ATTENTION_NUM_SMS="120",
    )
    assert other["compiled"] == 1  # a kernel traced for 148 SMs is not served to a 120-SM part
    counts = sorted(json.loads(p.read_text())["num_sms"] for p in cache.glob("v2/*/toolchain.json"))
    assert counts == [120, 148]


@pytest.mark.slow
def test_interval_masking_patches_hopper_only() -> None:
    # The R2P patch replaces the Hopper AttentionMask.apply_mask only; Blackwell's mask
    # code is FA4's own (not verified on hardware here, so not patched).
    from fa4cache.adapters.fa4 import interval_masking
    from flash_attn.cute import mask as fa_mask

    assert interval_masking.enable()
    patched = [
        n for n, f in vars(fa_mask.AttentionMask).items() if getattr(f, "__fa4cache_interval_patch__", False)
    ]
    assert patched == ["apply_mask"]
    assert os.environ.get("FLASH_ATTENTION_ARCH", "sm_90").startswith("sm_9")
