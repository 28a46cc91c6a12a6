"""Kernel specs: a JSON-able description of an FA4 call, for ahead-of-time warming.

The same format serves ``fa4cache warm --manifest``, ``warm --replay`` and the Ray
``prewarm``. A spec names what selects kernels (dtype, head dims, head counts,
mask, causal, backward), not the geometry: masks from :mod:`fa4cache.masks` compile
once for every geometry, so one representative ``seqlen`` covers all lengths.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fa4cache.arch import ARCH_ENV, ARCHS
from fa4cache.errors import ConfigError
from fa4cache.validate import positive_number

DTYPES = ("bf16", "fp16")
MASKS = (
    "none",
    "causal",
    "document",
    "document_window",
    "document_prefix",
    "document_bidirectional",
    "draft_block",
)
HEAD_DIMS = (64, 96, 128, 192, 256)


@dataclass(frozen=True)
class KernelSpec:
    """What to compile: one forward (and optionally its backward) kernel set."""

    dtype: str = "bf16"
    head_dim: int = 128
    head_dim_v: int | None = None
    heads: int = 16
    heads_kv: int | None = None
    mask: str = "document"
    backward: bool = True
    seqlen: int = 1024
    batch: int = 1
    window: int = 256
    block_size: int = 16
    arch: str = "sm_90"
    # Document masks: also compile what fa4cache.attention runs (FA4's varlen kernels).
    varlen: bool = False
    # Logit softcapping (Gemma 2's attn_logit_softcapping): a kernel per cap value.
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.mask not in MASKS:
            raise ConfigError(f"mask: expected one of {', '.join(MASKS)}, got {self.mask!r}")
        for name in ("head_dim", "heads", "seqlen", "batch", "window", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{name}: expected a positive int, got {v!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ConfigError(f"head_dim: expected one of {HEAD_DIMS}, got {self.head_dim}")
        hkv = self.heads_kv or self.heads
        if self.heads % hkv:
            raise ConfigError(f"heads: {self.heads} query heads is not a multiple of {hkv} kv heads")
        if self.softcap is not None and not positive_number(self.softcap):
            raise ConfigError(f"softcap: expected a positive number or null, got {self.softcap!r}")
        if self.arch not in ARCH_ENV:
            raise ConfigError(f"arch: expected one of {', '.join(ARCHS)}, got {self.arch!r}")

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "spec") -> KernelSpec:
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            return cls(**d)
        except (TypeError, ConfigError) as e:
            raise ConfigError(f"{where}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        hkv = self.heads_kv or self.heads
        mask = f"{self.mask}({self.window})" if self.mask == "document_window" else self.mask
        return (
            f"{self.dtype} d{self.head_dim} h{self.heads}:{hkv} {mask}"
            f"{f' softcap{self.softcap:g}' if self.softcap else ''}"
            f"{' varlen' if self.varlen else ''}{' +bwd' if self.backward else ''}"
        )


# Fields that select a kernel only for some masks: shown for those alone.
_ONLY_FOR = {"window": ("document_window",), "block_size": ("draft_block",)}


def relevant_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """A recorded spec without the fields its mask ignores (``window`` of a plain document
    mask, ``block_size`` of anything but a draft-block mask) and without unset options
    (``softcap``, ``heads_kv``, ``head_dim_v`` of None): what ``ls`` shows."""
    mask = spec.get("mask")
    return {
        k: v
        for k, v in spec.items()
        if (k not in _ONLY_FOR or mask in _ONLY_FOR[k]) and not (v is None and k in _OPTIONAL)
    }


_OPTIONAL = ("softcap", "heads_kv", "head_dim_v")


def manifest_entries(path: str | Path) -> tuple[Path, list[Any]]:
    """A manifest's entries (a JSON list, or ``{"specs": [...]}``); errors name the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"manifest {p}: no such file") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"manifest {p}: not valid JSON ({e})") from None
    if isinstance(data, dict) and "specs" in data:
        data = data["specs"]
    if not isinstance(data, list):
        raise ConfigError(f"manifest {p}: expected a JSON list of specs")
    return p, data


def load_manifest(path: str | Path) -> list[KernelSpec]:
    """The FA4 specs of a manifest; errors name the file and the entry."""
    p, data = manifest_entries(path)
    # Entries naming a jit_cache function ("jit") are fa4cache.aot.jit_spec's.
    return [
        KernelSpec.from_dict(d, where=f"manifest {p} entry {i}")
        for i, d in enumerate(data)
        if not (isinstance(d, dict) and "jit" in d)
    ]
