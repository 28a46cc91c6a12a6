"""A run's compile target, set in one place (adapters/compile/target.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

TARGET_VARS = ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS", "QUACK_ARCH")


def test_the_scope_sets_the_target_for_the_run_only(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cutlass")
    from fa4cache.adapters.compile.target import target_scope

    from fa4cache.aot.plan import Target

    for var in TARGET_VARS:
        monkeypatch.delenv(var, raising=False)
    with target_scope(Target("sm_90")):
        assert os.environ["FLASH_ATTENTION_ARCH"] == "sm_90" and os.environ["CUTE_DSL_ARCH"] == "sm_90a"
        assert os.environ["FLASH_ATTENTION_NUM_SMS"] == "132"
    assert not any(var in os.environ for var in TARGET_VARS)


@pytest.mark.compile
def test_verify_rebuild_compiles_for_the_entries_target_with_only_the_arch_named(tmp_path: Path) -> None:
    # A newcomer's walk: after `warm` on a CPU machine, `verify --rebuild 1` with only
    # FLASH_ATTENTION_ARCH set (what doctor says is enough) rebuilt nothing: every kernel
    # "not rebuilt: ... Only SM 9.x is supported", exit 0.
    store = tmp_path / "store"
    warm = run_cli(store, "warm", "--mask", "causal", "--no-backward", "--head-dim", "64")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    env = {k: v for k, v in os.environ.items() if k not in TARGET_VARS and not k.startswith("FA4CACHE_")}
    env.update(FLASH_ATTENTION_ARCH="sm_90", PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-m", "fa4cache", "--cache-dir", str(store), "verify", "--rebuild", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert "1 identical, 0 DIFFERENT, 0 not rebuilt" in p.stdout, p.stdout + p.stderr
