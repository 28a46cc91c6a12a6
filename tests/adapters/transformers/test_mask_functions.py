"""Which of transformers' composed mask rules the FA4 path computes (:mod:`fa4cache.adapters.transformers.mask_functions`):
built with transformers' own builders, as its mask creators compose them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
mu = pytest.importorskip("transformers.masking_utils")

from fa4cache.adapters.transformers.mask_functions import not_computed, not_computed_while_tracing  # noqa: E402


def _computed() -> dict[str, Any]:
    pad = mu.padding_mask_function(torch.ones(2, 8, dtype=torch.bool))
    rules = {
        "causal": mu.causal_mask_function,
        "bidirectional": mu.bidirectional_mask_function,
        "sliding": mu.sliding_window_causal_mask_function(4),
        "causal+padding": mu.and_masks(mu.causal_mask_function, pad),
        "sliding+padding, offsets": mu.add_offsets_to_mask_function(
            mu.and_masks(mu.sliding_window_causal_mask_function(4), pad), 3, 0
        ),
        "packed": mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(torch.zeros(1, 8))),
    }
    remap = getattr(mu, "remap_positions_for_packed_sequence", None)  # transformers 5.2x
    if remap is not None:
        rules["packed, remapped"] = remap(mu.causal_mask_function, torch.arange(8).view(1, 8))
    return rules


@pytest.mark.parametrize("name", list(_computed()))
def test_rules_the_fa4_path_computes(name: str) -> None:
    assert not_computed(_computed()[name]) is None


def _user_rule(batch_idx: Any, head_idx: Any, q_idx: Any, kv_idx: Any) -> Any:
    return kv_idx >= 0


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        (lambda: mu.chunked_causal_mask_function(4, torch.zeros(2, dtype=torch.long)), "chunked attention"),
        (lambda: mu.or_masks(mu.causal_mask_function, _user_rule), "or_mask_function"),
        (lambda: mu.and_masks(mu.causal_mask_function, _user_rule), "custom mask function"),
        (lambda: mu.blockwise_overlay(torch.zeros(2, 8, dtype=torch.long)), "block_sequence_ids"),
        (lambda: mu.sliding_window_bidirectional_mask_function(4), "bidirectional sliding window"),
        (lambda: _user_rule, "custom mask function"),
        # Nested inside what is computed: still found.
        (lambda: mu.add_offsets_to_mask_function(mu.and_masks(mu.causal_mask_function, mu.and_masks(_user_rule)), 1, 0),
         "custom mask function"),
    ],
)  # fmt: skip
def test_rules_it_does_not_are_named(rule: Any, named: str) -> None:
    why = not_computed(rule())
    assert why is not None and named in why, why


def test_while_tracing_the_rules_name_and_the_hooks_arguments_tell() -> None:
    chunked = SimpleNamespace(attention_chunk_size=8)
    traced = not_computed_while_tracing
    plain = {"config": SimpleNamespace(), "use_vmap": False, "allow_is_causal_skip": True}
    assert "own mask function" in traced(mu.causal_mask_function, 8, {"use_vmap": True})
    assert "chunked" in traced(mu.causal_mask_function, 8, {"config": chunked, "local_size": 8})
    assert traced(mu.sliding_window_causal_mask_function(8), 8, {**plain, "local_size": 8}) is None
    assert traced(mu.causal_mask_function, 8, {"config": chunked, "local_size": None}) is None
    bidir = {**plain, "local_size": 4, "allow_is_bidirectional_skip": True}
    assert "bidirectional sliding" in traced(mu.sliding_window_bidirectional_mask_function(4), 8, bidir)
    # An "or" at the top (image blocks, or_mask_function) is read from its name alone.
    blocks = mu.or_masks(mu.causal_mask_function, mu.blockwise_overlay(torch.zeros(1, 8, dtype=torch.long)))
    assert "widened" in traced(blocks, 8, plain)
    # Packed documents hide what is under them: kept as transformers' mask for a family with
    # image blocks, not for others, nor for a decode step (its new token is text).
    packed = mu.and_masks(blocks, mu.packed_sequence_mask_function(torch.zeros(1, 8)))
    gemma = {**plain, "allow_is_causal_skip": False, "config": SimpleNamespace(model_type="gemma3_text")}
    assert "block_sequence_ids" in traced(packed, 8, gemma)
    assert traced(packed, 1, gemma) is None
    assert traced(packed, 8, {**gemma, "config": SimpleNamespace(model_type="llama")}) is None


def test_every_family_that_passes_block_sequence_ids_is_known() -> None:
    # A family added to transformers with image blocks would be read as plain packed documents
    # while compiling: this fails first.
    from pathlib import Path

    import transformers
    from fa4cache.adapters.transformers.mask_functions import BLOCK_FAMILIES

    models = Path(transformers.__file__).parent / "models"
    users = {p.parent.name for p in models.glob("*/modeling_*.py") if "block_sequence_ids" in p.read_text()}
    assert users, "transformers no longer names block_sequence_ids: read mask_functions.py again"
    assert users <= set(BLOCK_FAMILIES), sorted(users - set(BLOCK_FAMILIES))
