"""The decode path's one chooser (fa4cache/decode/choose.py): which strategy a KV-cache step
gets, from the step's shapes, where it is asked (traced, eager, the op's body) and the three
decode switches, which a process reads once (fa4cache.settings.decode_switches)."""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fa4cache import settings  # noqa: E402
from fa4cache.decode import choose, launch_plans, one_row_sdpa, split_kv  # noqa: E402
from fa4cache.decode.choose import Strategy  # noqa: E402
from fa4cache.errors import ConfigError  # noqa: E402
from tests.helpers.switches import set_switch  # noqa: E402


@pytest.fixture
def step(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An eager one-row step without padding on FA4's device (the CPU stands in for CUDA),
    plans verified, every switch at its default."""
    monkeypatch.setattr(one_row_sdpa, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(launch_plans, "_verified", [True])
    monkeypatch.setenv("FLASH_ATTENTION_NUM_SMS", "132")
    for name in settings.DECODE_SWITCHES:
        set_switch(monkeypatch, name, None)
    query = torch.randn(1, 8, 1, 16)
    key = torch.randn(1, 2, 2048, 16)
    mask = torch.ones(1, 2048, dtype=torch.long)
    return query, key, key, mask


def test_each_strategy_is_chosen_where_it_applies(step: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    query, key, value, mask = step

    def chosen(
        q: Any = query, k: Any = key, m: Any = mask, window: Any = None, softcap: float = 0.0, **kw: Any
    ) -> Any:
        return choose.choose(q, k, k, m, window, softcap, **kw).strategy

    assert chosen() is Strategy.ONE_ROW_SDPA  # eager, one row, no padding
    assert chosen(traced=True) is Strategy.OP  # whatever the rest
    assert chosen(plain=False) is Strategy.LANES  # cross-attention and other non-generate steps: FA4
    assert chosen(window=99) is Strategy.LANES
    assert chosen(softcap=30.0) is Strategy.LANES
    padded = mask.clone()
    padded[0, :3] = 0
    assert chosen(m=padded) is Strategy.LANES
    assert (
        chosen(q=torch.randn(2, 8, 1, 16), k=torch.randn(2, 2, 2048, 16), m=torch.ones(2, 2048))
        is Strategy.LANES
    )
    assert chosen(q=torch.randn(1, 8, 3, 16)) is Strategy.LANES  # three queries
    # The op's body: a long cache at one query splits; the eager path never does.
    body = choose.choose(query, key, value, mask, None, 0.0, eager=False)
    assert body.strategy is Strategy.SPLIT_KV and body.split == split_kv.plan(2, 2048, 132)
    assert body.checks_mask and not choose.ONE_ROW_SDPA.checks_mask  # SDPA reads the mask itself
    assert chosen(eager=False, window=99) is Strategy.FA4  # a chunk's query would not see its window
    assert chosen(eager=False, k=torch.randn(1, 2, split_kv.MIN_KEYS - 1, 16), m=None) is Strategy.FA4
    # The switches.
    set_switch(monkeypatch, "FA4CACHE_ONE_ROW_SDPA", "0")
    assert chosen() is Strategy.LANES
    set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", "0")
    assert chosen() is Strategy.FA4
    set_switch(monkeypatch, "FA4CACHE_DECODE_SPLIT", "0")
    assert chosen(eager=False) is Strategy.FA4
    set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", None)
    monkeypatch.setattr(launch_plans, "_verified", [False])  # an FA4 whose sources were not checked
    assert chosen() is Strategy.FA4


def test_the_chooser_reads_no_environment_variable_per_step(
    step: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A step's choice runs in every layer: looking up an unset variable in os.environ raises and
    # catches a KeyError there. The switches are read once a process (before: one read per
    # call for the launch-plan switch, and per step for the others).
    query, key, value, mask = step
    padded = mask.clone()
    padded[0, :3] = 0
    launch_plans.enabled()  # the switches read (at the process's first decode call)
    reads: list[str] = []

    class Counting(dict):  # type: ignore[type-arg]
        def get(self, name: Any, default: Any = None) -> Any:
            reads.append(name)
            return super().get(name, default)

        def __getitem__(self, name: Any) -> Any:
            reads.append(name)
            return super().__getitem__(name)

    monkeypatch.setattr(os, "environ", Counting(os.environ))
    for _ in range(3):
        assert choose.choose(query, key, value, padded, None, 0.0).strategy is Strategy.LANES
        assert choose.choose(query, key, value, padded, None, 0.0, eager=False).strategy is Strategy.SPLIT_KV
        assert launch_plans.enabled()
    assert not [n for n in reads if n in settings.DECODE_SWITCHES], reads


def test_a_switch_changed_in_the_environment_is_seen_once_the_switches_are_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(settings, "_decode_switches", [])
    monkeypatch.delenv("FA4CACHE_DECODE_SPLIT", raising=False)
    assert settings.decode_switches().split
    monkeypatch.setenv("FA4CACHE_DECODE_SPLIT", "0")
    assert settings.decode_switches().split  # kept: read once a process
    assert not settings.reread_decode_switches().split
    assert not settings.decode_switches().split
    monkeypatch.setenv("FA4CACHE_DECODE_SPLIT", "maybe")
    with pytest.raises(ConfigError, match="FA4CACHE_DECODE_SPLIT"):
        settings.reread_decode_switches()
