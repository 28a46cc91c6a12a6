"""The warm plan (fa4cache.aot.plan) and how ``fa4cache warm`` builds one (fa4cache.cli.warm_plan)
and shows its progress (fa4cache.cli.progress): data only, no compile."""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import random
import sys
from pathlib import Path

import pytest

import fa4cache
from fa4cache.aot.plan import GENERATION_KEY, GenerationCall, Target, WarmPlan, item_of_record
from fa4cache.errors import ConfigError
from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Store

SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))
TARGET_VARS = ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS", "QUACK_ARCH")


def test_a_plan_is_typed_picklable_data_that_names_its_target_without_touching_the_environment() -> None:
    before = {k: os.environ.get(k) for k in TARGET_VARS}
    gen = {GENERATION_KEY: {"heads": 4, "heads_kv": 2, "head_dim": 64, "softcap": 0.0, "dtype": "bf16",
                            "window": None}, "arch": "sm_100a"}  # fmt: skip
    plan = WarmPlan.of([fa4cache.KernelSpec(arch="sm_100", backward=False), gen], num_sms=140)
    assert {k: os.environ.get(k) for k in TARGET_VARS} == before
    assert plan.target == Target("sm_100", 140) and plan.target.arch == "sm_100"
    assert (
        plan.target.env()["CUTE_DSL_ARCH"] == "sm_100a"
        and plan.target.env()["FLASH_ATTENTION_NUM_SMS"] == "140"
    )
    assert [type(i).__name__ for i in plan.items] == ["KernelSpec", "GenerationCall"]
    assert plan.generation[0].to_dict() == gen  # what its entries record, as before
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert Target().label() == "sm_90 (132 SMs)"


def test_one_target_arch_per_plan_and_bad_items_name_themselves() -> None:
    with pytest.raises(ConfigError, match="one target arch per run, got sm_100, sm_90"):
        WarmPlan.of([fa4cache.KernelSpec(), fa4cache.KernelSpec(arch="sm_100")])
    with pytest.raises(ConfigError, match=r"items\[0\]: expected a KernelSpec"):
        WarmPlan(("not a spec",))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_sms: expected a positive int"):
        Target("sm_90", 0)
    with pytest.raises(ConfigError, match="arch: expected one of"):
        Target("sm_80")


def test_generation_calls_round_trip_through_their_recorded_spec() -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    for _ in range(20):
        heads_kv = rng.choice([1, 2, 4])
        call = GenerationCall(
            heads=heads_kv * rng.choice([1, 2, 4]),
            heads_kv=heads_kv,
            head_dim=rng.choice([64, 128]),
            dtype=rng.choice(["bf16", "fp16"]),
            window=rng.choice([None, 127, 4095]),
            softcap=rng.choice([0.0, 30.0]),
        )
        recorded = json.loads(json.dumps(call.to_dict()))  # as a sidecar keeps it
        assert item_of_record(recorded) == call
    for bad in ({"generation": {"heads": "4"}, "arch": "sm_90"}, {"generation": {}}, None):
        with pytest.raises((ValueError, ConfigError)):
            item_of_record(bad)


def test_a_models_generation_calls_cover_its_full_and_sliding_layers() -> None:
    cfg = {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512, "sliding_window": 128,
           "layer_types": ["full_attention", "sliding_attention"]}  # fmt: skip
    calls = GenerationCall.for_model(cfg, ["bf16", "fp16"], "sm_90")
    assert [(c.dtype, c.window, c.head_dim) for c in calls] == [
        ("bf16", None, 64),
        ("bf16", 127, 64),  # transformers' window of 128 keys is FA4's 127 before the query
        ("fp16", None, 64),
        ("fp16", 127, 64),
    ]


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    from fa4cache.cli import build_parser

    return build_parser().parse_args(["--cache-dir", str(tmp_path / "c"), "warm", *argv])


def test_the_cli_turns_flags_and_a_config_into_one_plan(tmp_path: Path) -> None:
    from fa4cache.cli.warm_plan import plan_from_args

    plan, rep = plan_from_args(_args(tmp_path, "--mask", "causal", "--head-dim", "64", "--arch", "sm_100"))
    assert rep is None and plan.target == Target("sm_100")
    assert [(s.mask, s.head_dim, s.arch) for s in plan.specs] == [("causal", 64, "sm_100")]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256}))
    plan, _ = plan_from_args(_args(tmp_path, "--hf-config", str(cfg), "--generation", "--no-backward"))
    assert len(plan.specs) >= 1 and not any(s.backward for s in plan.specs)
    assert plan.generation == [GenerationCall(4, 2, 64, "bf16", None, 0.0, "sm_90")]


def test_replay_makes_one_plan_of_every_kind_the_store_recorded(tmp_path: Path) -> None:
    from fa4cache.cli.warm_plan import plan_from_args

    tc = "0123456789abcdef0123"
    store = Store.at(tmp_path / "c")
    store.record_toolchain(tc, {"id": tc})
    gen = GenerationCall(4, 2, 64)
    records = [fa4cache.KernelSpec(backward=False).to_dict(), gen.to_dict(), None]
    for n, spec in enumerate(records, 1):
        ref = EntryRef(tc, "fwd", f"{n}" * 64)
        assert store.publish_bytes(ref, b"\x7fELF" + bytes(100 + n), summary={"dtype": "bf16"}, spec=spec)
    plan, rep = plan_from_args(_args(tmp_path, "--replay"))
    assert plan.specs == [fa4cache.KernelSpec(backward=False)] and plan.generation == [gen]
    assert (
        rep is not None and rep.unreplayable == 1 and "1 entry carries no replayable spec" in rep.notes()[0]
    )


def test_progress_without_a_terminal_says_each_kernel_as_it_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fa4cache.cli.progress import Progress

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    tc = "0123456789abcdef0123"
    store = Store.at(tmp_path / "c")
    store.record_toolchain(tc, {"id": tc})
    with Progress(str(tmp_path / "c"), 1, quiet=False) as progress:
        progress.start()
        store.publish_bytes(EntryRef(tc, "fwd", "1" * 64), b"\x7fELF" + bytes(100), summary={"dtype": "bf16"})
        progress.spec_done(None)
    text = err.getvalue()
    assert text.startswith("warming 1 spec: one line per kernel stored\n"), text
    assert "  stored fwd kernel (1 so far, " in text, text
