"""A transformers model's kernel set, compiled at model load through the one warm runner."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.compile

SEED = int(os.environ["FA4CACHE_FUZZ_SEED"])


def test_model_load_starts_the_model_kernel_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``register()`` then building a model for ``attn_implementation="fa4cache"`` starts the
    kernel set ``warm --hf-config`` lists for its config, in real background workers."""
    pytest.importorskip("transformers")
    import logging

    from fa4cache.adapters import transformers as fa4t
    from fa4cache.adapters.compile import ahead
    from fa4cache.adapters.compile import server as compile_server
    from fa4cache.adapters.compile.task import default_jobs
    from fa4cache.adapters.transformers import model_load
    from transformers import AutoModelForCausalLM, LlamaConfig

    import fa4cache
    from fa4cache.aot.model_config import specs_for

    monkeypatch.setenv("FA4CACHE_COMPILE_AHEAD", "1")
    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path / "cache"))
    rng = random.Random(SEED)
    heads_kv = rng.choice([1, 2, 4])
    cfg = LlamaConfig(
        hidden_size=512, num_attention_heads=4, num_key_value_heads=heads_kv, num_hidden_layers=1,
        intermediate_size=64, vocab_size=64,
    )  # fmt: skip
    started: list[list[Any]] = []
    real = model_load.start_model_set
    monkeypatch.setattr(model_load, "start_model_set", lambda specs: started.append(specs) or real(specs))
    with compile_server._live_lock:
        before = set(compile_server._live)
    try:
        fa4t.register()
        with caplog.at_level(logging.INFO, logger="fa4cache.adapters.transformers.model_load"):
            AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4cache")
        with compile_server._live_lock:
            workers = set(compile_server._live) - before
        # post_init runs for the inner model and the wrapper: one start, one log line
        assert started and all(s == specs_for(cfg.to_dict()) for s in started), f"seed {SEED}: {heads_kv}"
        assert workers and all(w.proc.poll() is None for w in workers)
        lines = [r.getMessage() for r in caplog.records if "kernel set of" in r.getMessage()]
        assert len(lines) == 1 and f"bf16 d128 h4:{heads_kv} document varlen +bwd" in lines[0]
        # The whole set in parallel: as many workers as kernels, within this process's cores.
        assert f"in {ahead.children(default_jobs(started[0]))} background worker" in lines[0], lines
        n = len(started)
        AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")  # not ours: nothing starts
        assert len(started) == n
    finally:
        for w in set(compile_server._live) - before:
            w.kill()  # the kernels themselves are another test's business
        fa4cache.uninstall()


def test_a_stored_model_set_starts_no_compile_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose kernel set warm has stored starts no server at model load (a server is
    a process with torch and FA4 imported beside each rank); a set one kernel short does."""
    from fa4cache.adapters.compile import ahead, background
    from fa4cache.adapters.compile.task import KERNELS_PER_SPEC
    from fa4cache.adapters.transformers import model_load

    from fa4cache.aot.spec import KernelSpec
    from fa4cache.store import runtime
    from fa4cache.store.runtime import record_spec
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import TOOLCHAIN, FakeFA4

    monkeypatch.setenv("FA4CACHE_COMPILE_AHEAD", "1")
    assert ahead.enabled()
    rng = random.Random(SEED)
    specs = [
        KernelSpec(mask=rng.choice(["causal", "document"]), head_dim=d) for d in rng.sample([64, 96, 128], 2)
    ]
    print(f"seed {SEED}: {[s.label() for s in specs]}")
    store = Store.at(tmp_path / "c")
    runtime.register(store, lambda: TOOLCHAIN)
    try:
        key = 0
        for i, spec in enumerate(specs):
            n = KERNELS_PER_SPEC[spec.backward] - (1 if i == len(specs) - 1 else 0)  # the last one short
            with record_spec(spec.to_dict()):
                for _ in range(n):
                    key += 1
                    FakeFA4(store).call(key, 0)
        assert background.set_is_stored(specs[:-1])
        assert not background.set_is_stored(specs)  # one kernel short: compile ahead
        with record_spec(specs[-1].to_dict()):
            FakeFA4(store).call(key + 1, 0)
        assert background.set_is_stored(specs)

        def no_server(**kw: object) -> None:
            raise AssertionError("a compile server was started for a stored kernel set")

        monkeypatch.setattr(ahead, "_get_server", no_server)
        assert model_load.start_model_set(specs) == []
    finally:
        runtime.unregister()
