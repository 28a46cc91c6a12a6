"""A sweep over the model families the installed transformers registers: each built tiny from
its own default config (``AutoConfig.for_model``, sizes shrunk), loaded with ``"eager"`` and
with ``"fa4cache"``, and driven with the inputs its ``main_input_name`` asks for.

Each family ends in one verdict (:data:`VERDICTS`): refused by name, accepted and equal to
eager with fa4cache's attention called, or one of the outcomes the adapter must never give
(accepted and different, accepted and never calling fa4cache, a crash where eager runs, a
refusal that names neither the model nor ``'eager'``). Families whose tiny config or inputs
this sweep cannot make (eager itself fails) are counted as not driven, with the reason.

The test (``tests/adapters/transformers/test_transformers.py``) runs it under the FA4 stand-in and
prints one line per family and the counts (``pytest -s``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import Any

# What a family may end in. The first three are right; the rest are the adapter's defects.
VERDICTS = (
    "match",
    "refused",
    "no attention",
    "not driven",
    "wrong",
    "no fa4cache call",
    "crash",
    "refused without a name",
)
BAD = frozenset(VERDICTS[4:])

# Config keys and the value a tiny model takes (only keys the config already has are set).
_WIDTH = 32
_SIZES: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim", "word_embed_proj_dim"), _WIDTH),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
                     "moe_intermediate_size", "shared_expert_intermediate_size", "intermediate_size_mlp"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "num_encoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), 2),
    "head_dim": 8,
    "vocab_size": 99,
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k"), 2),
}  # fmt: skip
_LAYER_COUNTS = (
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_layers",
    "decoder_layers",
    "num_decoder_layers",
)


def tiny(config: Any) -> Any:
    """``config`` (and its sub-configs) with the sizes of :data:`_SIZES`; per-layer lists as long
    as the old layer count are cut to the new one."""
    from transformers import PretrainedConfig

    config = copy.deepcopy(config)

    def shrink(cfg: Any) -> None:
        old = next((getattr(cfg, k) for k in _LAYER_COUNTS if isinstance(getattr(cfg, k, None), int)), None)
        for key, value in _SIZES.items():
            if isinstance(getattr(cfg, key, None), int) and not isinstance(getattr(cfg, key), bool):
                setattr(
                    cfg,
                    key,
                    min(value, getattr(cfg, key)) if key in ("num_experts_per_tok", "top_k") else value,
                )
        for key, value in list(vars(cfg).items()):
            if isinstance(value, PretrainedConfig):
                shrink(value)
            elif isinstance(value, list) and old and len(value) == old and old != 2:
                setattr(cfg, key, value[:2])

    shrink(config)
    return config


def inputs(model: Any) -> dict[str, Any]:
    """Two rows of what the model's forward takes first; text gets a 2-D mask with two left
    padding tokens in the second row (what the mask hook and the FA4 path see)."""
    import torch

    g = torch.Generator().manual_seed(0)
    cfg = model.config
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        vocab = getattr(cfg.get_text_config(), "vocab_size", None) or 99
        ids = torch.randint(3, min(vocab, 99), (2, 8), generator=g)
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, :2] = 0
        out = {"input_ids": ids, "attention_mask": mask}
        if getattr(cfg, "is_encoder_decoder", False):
            out["decoder_input_ids"] = ids[:, :5].clone()
        return out
    if name == "pixel_values":
        vision = getattr(cfg, "vision_config", None) or cfg
        size = getattr(vision, "image_size", 32)
        size = size[0] if isinstance(size, (list, tuple)) else size
        return {"pixel_values": torch.randn(2, getattr(vision, "num_channels", 3), size, size, generator=g)}
    if name == "input_values":
        return {"input_values": torch.randn(2, 1600, generator=g)}
    if name == "input_features":
        return {"input_features": torch.randn(2, getattr(cfg, "num_mel_bins", 80), 60, generator=g)}
    raise NotImplementedError(f"main_input_name {name!r}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    family: str
    verdict: str
    detail: str = ""


def _first_tensor(out: Any) -> Any:
    import torch

    for v in out.values() if hasattr(out, "values") else out:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    raise ValueError("no float output")


def _forward(model: Any, x: dict[str, Any]) -> Any:
    """The first float output, the random draws of the forward seeded (ViT-MAE's masking
    noise: the same tokens kept for eager and fa4cache)."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        return _first_tensor(model(**x))


def check(family: str, calls: Counter[str]) -> Outcome:
    """One family's verdict. ``calls["attention"]`` counts fa4cache's attention calls (the
    caller wraps the adapter's ``attention_forward`` to count them)."""
    import torch
    from transformers import AutoConfig, AutoModel

    try:
        config = tiny(AutoConfig.for_model(family))
        torch.manual_seed(0)
        ref = AutoModel.from_config(
            copy.deepcopy(config), attn_implementation="eager", dtype=torch.float32
        ).eval()
    except Exception as e:
        return Outcome(family, "not driven", f"eager model not built: {type(e).__name__}: {str(e)[:120]}")
    cls = type(ref).__name__
    try:
        torch.manual_seed(0)
        got = AutoModel.from_config(
            copy.deepcopy(config), attn_implementation="fa4cache", dtype=torch.float32
        ).eval()
    except ValueError as e:
        msg = str(e)
        # (A composite model is refused by the part that has attention code of its own.)
        if msg.startswith("fa4cache attention: ") and "'eager'" in msg:
            return Outcome(family, "refused", msg.split(";")[0][:200])
        return Outcome(family, "refused without a name", msg[:200])
    except Exception as e:
        return Outcome(family, "crash", f"fa4cache model not built: {type(e).__name__}: {str(e)[:160]}")
    try:
        x = inputs(ref)
        want = _forward(ref, x)
    except Exception as e:
        return Outcome(family, "not driven", f"eager forward: {type(e).__name__}: {str(e)[:120]}")
    before = calls["attention"]
    try:
        have = _forward(got, x)
    except Exception as e:
        return Outcome(family, "crash", f"fa4cache forward: {type(e).__name__}: {str(e)[:200]}")
    if calls["attention"] == before:
        if not any("Attention" in type(m).__name__ for m in got.modules()):
            return Outcome(family, "no attention", cls)  # (Mamba, ResNet, ...: nothing to run)
        return Outcome(family, "no fa4cache call", cls)
    padded = "attention_mask" in x and have.shape[:2] == x["attention_mask"].shape
    if "attention_mask" in x and not padded:
        # One vector per row (DPR's pooled first token): with left padding it is a padding
        # token's, which no implementation defines (flash attention's are zeros). The same
        # padding on the right keeps it a real token's.
        x = {**x, "attention_mask": x["attention_mask"].flip(1)}
        try:
            want, have = _forward(ref, x), _forward(got, x)
        except Exception as e:
            return Outcome(family, "crash", f"right-padded forward: {type(e).__name__}: {str(e)[:200]}")
    keep = x["attention_mask"].bool() if padded else None
    a, b = (t[keep] if keep is not None else t for t in (have, want))
    if a.shape != b.shape or not torch.allclose(a, b, atol=1e-4, rtol=1e-4, equal_nan=True):
        diff = (
            (a - b).abs().nan_to_num(0).max().item()
            if a.shape == b.shape
            else f"shape {a.shape} vs {b.shape}"
        )
        return Outcome(family, "wrong", f"{cls}: {diff}")
    return Outcome(family, "match", cls)


def families() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(set(CONFIG_MAPPING_NAMES) & set(MODEL_MAPPING_NAMES))
