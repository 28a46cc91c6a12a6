"""Issue 2: the persistent store wired into FA4's compile caches, with real compiles."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fa4cache.store import LAYOUT

from .conftest import ROOT, finish, run_worker, start_worker, worker_env

pytestmark = pytest.mark.compile

KERNELS_PER_DOC_SET = 4  # forward, backward, backward pre- and post-processing


def _objects(d: Path) -> list[Path]:
    return sorted((d / LAYOUT).glob("*/*/*.o"))


def test_twenty_geometries_compile_one_kernel_set(doc_store: dict[str, Any]) -> None:
    r = doc_store["result"]
    assert r["compiles"] == KERNELS_PER_DOC_SET, r
    assert r["misses"] == KERNELS_PER_DOC_SET
    # The forward (first and later blocks) and the backward were traced through the
    # interval masking path, not FA4's element-wise mask_mod path.
    assert r["interval_traces"] >= 2, r
    # 19 later layouts found every kernel in memory: 4 lookups each.
    assert r["memory_hits"] >= 19 * KERNELS_PER_DOC_SET
    objs = _objects(doc_store["dir"])
    assert len(objs) == KERNELS_PER_DOC_SET
    kinds = sorted(p.parent.name for p in objs)
    assert kinds == ["bwd", "bwd_post", "bwd_pre", "fwd"]
    for p in objs:
        assert p.stat().st_mode & 0o777 == 0o600
        side = json.loads(p.with_suffix(".json").read_text())
        assert side["size"] == p.stat().st_size and side["compile_seconds"] > 0


def test_second_process_other_hash_seed_compiles_nothing(doc_store_copy: Path) -> None:
    # Different PYTHONHASHSEED and different layouts than the process that filled the store.
    r = run_worker(doc_store_copy, "geometries", "--geometries", "3", "--seed", "99", PYTHONHASHSEED="12345")
    assert r["compiles"] == 0, r
    assert r["disk_hits"] == KERNELS_PER_DOC_SET
    assert r["corrupt"] == 0


def test_element_wise_masking_is_a_separate_kernel(doc_store_copy: Path) -> None:
    # FA4CACHE_INTERVAL_MASKING=0 emits other code, so it must not be served the
    # interval kernels from the store: new forward and backward, same pre/post kernels.
    before = {p.name for p in _objects(doc_store_copy)}
    r = run_worker(
        doc_store_copy, "geometries", "--geometries", "2", "--seed", "3", FA4CACHE_INTERVAL_MASKING="0"
    )
    assert r["interval_traces"] == 0, r
    assert r["compiles"] == 2, r
    new = {p.parent.name for p in _objects(doc_store_copy) if p.name not in before}
    assert new == {"fwd", "bwd"}


def test_four_cold_processes_compile_each_kernel_once(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    go = tmp_path / "go"
    procs = [
        start_worker(
            d, "compile", "--mask", "causal", "--seqlen", "512", "--wait-file", str(go), PYTHONHASHSEED=str(i)
        )
        for i in range(4)
    ]
    # Release them together once all are past their imports.
    time.sleep(1.0)
    go.touch()
    results = [finish(p) for p in procs]
    total = sum(r["compiles"] for r in results)
    kernels = len(_objects(d))
    assert kernels == KERNELS_PER_DOC_SET
    assert total == kernels, [(r["compiles"], r["disk_hits"], r["lock_waits"]) for r in results]
    assert sum(r["disk_hits"] for r in results) == 3 * kernels


def test_truncated_artifact_is_quarantined_and_recompiled(doc_store_copy: Path) -> None:
    fwd = next(p for p in _objects(doc_store_copy) if p.parent.name == "fwd")
    data = fwd.read_bytes()
    fwd.write_bytes(data[: len(data) // 2])
    r = run_worker(doc_store_copy, "geometries", "--geometries", "1", "--seed", "3")
    assert r["corrupt"] == 1, r
    assert r["compiles"] == 1  # only the damaged forward kernel
    assert r["disk_hits"] == KERNELS_PER_DOC_SET - 1
    q = list((doc_store_copy / "quarantine").glob("*.o"))
    assert len(q) == 1 and q[0].stat().st_size == len(data) // 2
    assert fwd.read_bytes() != data[: len(data) // 2] and fwd.stat().st_size > 0
    # The republished entry verifies and the next process loads it.
    r2 = run_worker(doc_store_copy, "geometries", "--geometries", "1", "--seed", "4")
    assert r2["compiles"] == 0 and r2["corrupt"] == 0


def test_install_does_not_import_heavy_modules(tmp_path: Path) -> None:
    r = run_worker(tmp_path / "c", "lazy")
    assert r["heavy"] == [], r
    assert Path(r["root"]).stat().st_mode & 0o777 == 0o700


def test_install_is_idempotent_and_uninstall_restores(tmp_path: Path) -> None:
    code = r"""
import json, os, sys
import fa4cache
from fa4cache.adapters import flash_attn as ad
s1 = fa4cache.install()
s2 = fa4cache.install()
assert 'flash_attn' not in sys.modules
from flash_attn.cute import interface as fi
patched = {n for n, o in vars(fi).items() if getattr(o, '__fa4cache_guard__', False)}
assert {'_flash_attn_fwd', '_flash_attn_bwd', '_bwd_preprocess', '_bwd_postprocess_convert'} <= patched, patched
assert type(fi._flash_attn_fwd.compile_cache).__name__ == 'StoreCompileCache'
fa4cache.install()  # again: no double wrapping
assert not getattr(fi._flash_attn_fwd.__wrapped__, '__fa4cache_guard__', False)
fa4cache.uninstall(); fa4cache.uninstall()
from flash_attn.cute.cache_utils import JITCache
assert isinstance(fi._flash_attn_fwd.compile_cache, JITCache)
assert not any(getattr(o, '__fa4cache_guard__', False) for o in vars(fi).values())
s3 = fa4cache.install()
assert type(fi._flash_attn_fwd.compile_cache).__name__ == 'StoreCompileCache'
other = fa4cache.install(os.environ['OTHER'])
assert other.root != s3.root and fi._flash_attn_fwd.compile_cache._inst.store is other
print('RESULT ' + json.dumps({'same': s1 is s2, 'patched': len(patched)}))
"""
    env = worker_env(tmp_path / "c", OTHER=str(tmp_path / "other"))
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1][7:])
    assert res["same"] is True and res["patched"] >= 4


def test_compile_error_releases_the_lock(tmp_path: Path) -> None:
    # A compile that raises (an unsupported head dim) must not leave its key locked:
    # a second call in another process gets the same clean error, not a lock wait.
    code = r"""
import json, os, time
os.environ.setdefault('FLASH_ATTENTION_ARCH', 'sm_90'); os.environ.setdefault('CUTE_DSL_ARCH', 'sm_90a')
import fa4cache
store = fa4cache.install()
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute import interface as fi
def bad_mask(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
    raise RuntimeError('mask bug')
bad_mask.__cute_hash__ = 'b' * 64
err = None
t0 = time.perf_counter()
with FakeTensorMode():
    q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16, device='cuda')
    try:
        fi._flash_attn_fwd(q, q, q, mask_mod=bad_mask)
    except Exception as e:
        err = type(e).__name__
import filelock
locks = list((store.root / 'locks').glob('*.lock'))
free = []
for lp in locks:
    lk = filelock.FileLock(str(lp), timeout=0, is_singleton=False)
    lk.acquire(); lk.release(); free.append(str(lp))
print('RESULT ' + json.dumps({'err': err, 'locks': len(locks), 'free': len(free), 'seconds': time.perf_counter() - t0}))
"""
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=worker_env(tmp_path / "c"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1][7:])
    assert res["err"] is not None
    assert res["locks"] >= 1 and res["free"] == res["locks"]
    assert not list((tmp_path / "c" / LAYOUT).glob("*/*/*.o"))
