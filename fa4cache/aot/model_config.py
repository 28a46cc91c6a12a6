"""The kernel specs a transformers model runs with ``attn_implementation="fa4cache"``, read
from its ``config.json`` alone (transformers is not imported), so that ``fa4cache warm
--hf-config`` can fill a store for a model before any GPU sees it.

What the adapter runs: document-causal attention on FA4's varlen kernels (packed and
padded steps), forward and backward; for layers with a sliding window of ``w`` keys also
the windowed set (``window = w - 1``). Sliding layers see steps shorter than the window as
plain causal, so a sliding model needs both sets. A model that softcaps its attention
logits (``attn_logit_softcapping``, Gemma 2) runs kernels with that cap compiled in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fa4cache.aot.spec import KernelSpec
from fa4cache.errors import ConfigError
from fa4cache.validate import positive_number

_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}


def load_config(path: str | Path) -> dict[str, Any]:
    """``config.json`` (or a directory holding one); a multimodal config's ``text_config``."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"--hf-config: cannot read {p}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--hf-config: {p} is not JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"--hf-config: {p} holds a {type(cfg).__name__}, not a config object")
    if "num_attention_heads" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    return cfg


def _positive_int(cfg: dict[str, Any], name: str) -> int:
    v = cfg.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"--hf-config: {name}: expected a positive int, got {v!r}")
    return v


def sliding_window(cfg: dict[str, Any]) -> int | None:
    """The sliding window in keys, if any layer slides, as transformers decides per layer:
    ``layer_types`` when the config lists them, else every layer slides when
    ``sliding_window`` is set (unless ``use_sliding_window`` is false, as in Qwen)."""
    w = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return w if "sliding_attention" in types else None
    if cfg.get("use_sliding_window", True) is False:
        return None
    return w


def specs_for(
    cfg: dict[str, Any],
    *,
    dtypes: list[str] | None = None,
    backward: bool = True,
    arch: str = "sm_90",
) -> list[KernelSpec]:
    heads = _positive_int(cfg, "num_attention_heads")
    heads_kv = _positive_int(cfg, "num_key_value_heads") if "num_key_value_heads" in cfg else heads
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        head_dim = _positive_int(cfg, "hidden_size") // heads
    window = sliding_window(cfg)
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 2):
        raise ConfigError(f"--hf-config: sliding_window: expected an int >= 2, got {window!r}")
    softcap = cfg.get("attn_logit_softcapping")
    if softcap is not None and not positive_number(softcap):
        raise ConfigError(f"--hf-config: attn_logit_softcapping: expected a positive number, got {softcap!r}")
    dtype = cfg.get("dtype") or cfg.get("torch_dtype")
    masks = ["document", "document_window"] if window is not None else ["document"]
    return [
        KernelSpec(
            dtype=d,
            head_dim=head_dim,
            heads=heads,
            heads_kv=heads_kv if heads_kv != heads else None,
            mask=m,
            backward=backward,
            window=window - 1 if m == "document_window" and window is not None else 256,
            arch=arch,
            varlen=True,
            softcap=float(softcap) if softcap is not None else None,
        )
        for d in dtypes or [_DTYPES.get(dtype, "bf16")]
        for m in masks
    ]
