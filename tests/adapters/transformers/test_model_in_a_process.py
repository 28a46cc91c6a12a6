"""A transformers model built and run with ``attn_implementation="fa4cache"`` in a process of
its own: what it says on CPU tensors, and that its background kernel set does not delay exit.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, worker_env

_MODEL = """
import logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(message)s")
import torch
from fa4cache.adapters import transformers as fa4t
from transformers import AutoModelForCausalLM, LlamaConfig
fa4t.register()
cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1,
                  intermediate_size=64, vocab_size=64)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4cache")
if sys.argv[1] == "forward":
    try:
        model(torch.randint(0, 64, (1, 16)), position_ids=torch.arange(16)[None])
    except Exception as e:
        print("ERROR", type(e).__name__, e)
print("DONE", time.time(), flush=True)
"""


def _model_process(tmp_path: Path, what: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, "-c", _MODEL, what],
        cwd=ROOT,
        env=worker_env(tmp_path / "cache", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    done = next(float(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("DONE"))
    return p, time.time() - max(done, t0)


def test_transformers_adapter_on_cpu_tensors_says_what_to_do(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    p, _ = _model_process(tmp_path, "forward", FA4CACHE_COMPILE_AHEAD="0")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("ERROR"))
    assert line.startswith("ERROR ValueError") and "need CUDA tensors" in line and "on cpu" in line, line
    assert "model.to('cuda')" in line


@pytest.mark.compile
def test_the_kernel_set_compiled_at_model_build_does_not_delay_exit(tmp_path: Path) -> None:
    """Building a model starts its kernel set compiling in the background; a process that
    then ends does not wait for it (it waited ~10 s, a compile, before)."""
    pytest.importorskip("transformers")
    from fa4cache.adapters.compile.task import KERNELS_PER_SPEC
    from fa4cache.adapters.transformers.model_load import specs_of_config
    from transformers import LlamaConfig

    from fa4cache.store.store import Store

    p, exit_s = _model_process(tmp_path, "build", FA4CACHE_COMPILE_AHEAD="1")
    assert "compiling the kernel set of" in p.stderr, p.stderr
    # Judged by what was stored when the process had ended, not by a clock (a loaded CI
    # machine stretches both): had the exit waited, the whole set would be there.
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1,
                      intermediate_size=64, vocab_size=64)  # fmt: skip
    kernels = sum(KERNELS_PER_SPEC[s.backward] for s in specs_of_config(cfg))
    stored = len(list(Store.at(tmp_path / "cache").entries()))
    assert kernels >= 2 and stored < kernels, f"{stored} of {kernels} kernels stored at exit ({exit_s:.1f} s)"
