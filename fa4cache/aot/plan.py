"""A warm plan: what to compile (FA4 kernel specs, jit calls, generation calls) and for which
target (arch, SM count), as frozen, picklable data.

The one runner (:func:`fa4cache.warm`) takes a plan, in this process, over ``-j`` workers, or
split across a job's nodes; the CLI turns its flags, manifests, ``--hf-config`` and
``--replay`` into one. A plan names its target instead of setting environment variables: the
runner sets what FA4 reads for a cross-compile, for the run only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fa4cache.aot.jit_spec import JitCall
from fa4cache.aot.spec import KernelSpec
from fa4cache.arch import ARCH_ENV, DEFAULT_NUM_SMS, NUM_SMS_VAR, cross_compile_env, parse_arch
from fa4cache.errors import ConfigError

GENERATION_KEY = "generation"  # a sidecar spec {"generation": {...}, "arch": ...}: warm --replay
DEFAULT_ARCH = "sm_90"  # H100/H200: a plan's arch when its items name none


@dataclass(frozen=True)
class Target:
    """The GPU kernels are compiled for: ``arch`` (``sm_90``, ``sm_100``, ...) and its SM count
    (None: ``FLASH_ATTENTION_NUM_SMS`` when it was set for this arch, else the full part's)."""

    arch: str = DEFAULT_ARCH
    num_sms: int | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCH_ENV:
            raise ConfigError(f"arch: expected one of {', '.join(ARCH_ENV)}, got {self.arch!r}")
        object.__setattr__(self, "arch", ARCH_ENV[self.arch][0])  # sm_90a and sm_90 are one target
        n = self.num_sms
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n <= 0):
            raise ConfigError(f"num_sms: expected a positive int or None, got {n!r}")

    def env(self) -> dict[str, str]:
        """The variables FA4, the CuTe DSL and QuACK read to compile for this target."""
        env = cross_compile_env(self.arch, self.num_sms)
        env["QUACK_ARCH"] = ARCH_ENV[self.arch][1]
        return env

    def sms(self) -> int:
        """The SM count kernels are built for."""
        return int(self.env().get(NUM_SMS_VAR) or DEFAULT_NUM_SMS[parse_arch(self.arch) or 0])

    def label(self) -> str:
        return f"{self.arch} ({self.sms()} SMs)"


@dataclass(frozen=True)
class GenerationCall:
    """The generation calls of one layer kind of a model (``warm --generation``): a KV-cache
    step and a continuous-batching step, decode and with prompts, and the split decode call."""

    heads: int
    heads_kv: int
    head_dim: int
    dtype: str = "bf16"
    window: int | None = None  # FA4's window before the query (transformers' window - 1)
    softcap: float = 0.0
    arch: str = DEFAULT_ARCH

    def __post_init__(self) -> None:
        for name in ("heads", "heads_kv", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{name}: expected a positive int, got {v!r}")
        if self.dtype not in ("bf16", "fp16"):
            raise ConfigError(f"dtype: expected bf16 or fp16, got {self.dtype!r}")
        w = self.window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool)):
            raise ConfigError(f"window: expected an int or None, got {w!r}")
        if not isinstance(self.softcap, (int, float)) or isinstance(self.softcap, bool):
            raise ConfigError(f"softcap: expected a number, got {self.softcap!r}")
        if self.arch not in ARCH_ENV:
            raise ConfigError(f"arch: expected one of {', '.join(ARCH_ENV)}, got {self.arch!r}")

    def to_dict(self) -> dict[str, Any]:
        """The spec its entries record (what ``warm --replay`` reads back)."""
        shape = {"heads": self.heads, "heads_kv": self.heads_kv, "head_dim": self.head_dim}
        g = {**shape, "softcap": self.softcap, "dtype": self.dtype, "window": self.window}
        return {GENERATION_KEY: g, "arch": self.arch}

    @classmethod
    def from_dict(cls, item: Any) -> GenerationCall:
        """A recorded generation spec; ``ValueError`` for one this version cannot run."""
        g = item.get(GENERATION_KEY) if isinstance(item, dict) else None
        if not isinstance(g, dict) or not isinstance(item.get("arch"), str):
            raise ValueError(f"not a generation spec: {item!r:.120}")
        try:
            return cls(**g, arch=item["arch"])
        except (TypeError, ConfigError):
            raise ValueError(f"not a generation spec: {item!r:.120}") from None

    def label(self) -> str:
        window = f" window {self.window}" if self.window is not None else ""
        softcap = f" softcap{self.softcap:g}" if self.softcap else ""
        return f"generation {self.dtype} d{self.head_dim} h{self.heads}:{self.heads_kv}{window}{softcap}"

    @classmethod
    def for_model(cls, cfg: dict[str, Any], dtypes: list[str], arch: str) -> list[GenerationCall]:
        """The generation calls of the model ``cfg`` (its config.json), one per dtype and window."""
        from fa4cache.aot.model_config import _positive_int, sliding_window

        heads = _positive_int(cfg, "num_attention_heads")
        heads_kv = _positive_int(cfg, "num_key_value_heads") if "num_key_value_heads" in cfg else heads
        head_dim = cfg.get("head_dim") or _positive_int(cfg, "hidden_size") // heads
        w = sliding_window(cfg)
        types = cfg.get("layer_types")
        windows: list[int | None] = [None]
        if w is not None:  # transformers' window of w keys is FA4's w - 1 before the query
            some_full = isinstance(types, list) and "full_attention" in types
            windows = ([None] if some_full else []) + [w - 1]
        softcap = float(cfg.get("attn_logit_softcapping") or 0.0)
        return [
            cls(heads, heads_kv, head_dim, d, window, softcap, arch) for d in dtypes for window in windows
        ]


Item = KernelSpec | JitCall | GenerationCall


@dataclass(frozen=True)
class WarmPlan:
    """What one warm run compiles, and for which target; every item names that target's arch
    (FA4 reads its target once per process: one arch per run)."""

    items: tuple[Item, ...]
    target: Target = Target()

    def __post_init__(self) -> None:
        object.__setattr__(self, "items", tuple(self.items))
        for i, item in enumerate(self.items):
            if not isinstance(item, (KernelSpec, JitCall, GenerationCall)):
                raise ConfigError(
                    f"items[{i}]: expected a KernelSpec, JitCall or GenerationCall, got {type(item).__name__}"
                )
        archs = sorted({ARCH_ENV[i.arch][0] for i in self.items} | {self.target.arch})
        if len(archs) > 1:
            raise ConfigError(
                f"one target arch per run, got {', '.join(archs)}; run warm once per arch (--arch)"
            )

    @classmethod
    def of(cls, items: Iterable[Item | dict[str, Any]], *, num_sms: int | None = None) -> WarmPlan:
        """A plan of ``items`` (KernelSpec, JitCall, GenerationCall, or their dicts) for the arch
        they name (``sm_90`` when there are none)."""
        parsed = [_item(x) for x in items]
        arch = parsed[0].arch if parsed else DEFAULT_ARCH
        return cls(tuple(parsed), Target(arch, num_sms))

    @property
    def specs(self) -> list[KernelSpec]:
        return [i for i in self.items if isinstance(i, KernelSpec)]

    @property
    def jit_calls(self) -> list[JitCall]:
        return [i for i in self.items if isinstance(i, JitCall)]

    @property
    def generation(self) -> list[GenerationCall]:
        return [i for i in self.items if isinstance(i, GenerationCall)]


def _item(x: Any) -> Item:
    if isinstance(x, (KernelSpec, JitCall, GenerationCall)):
        return x
    if isinstance(x, dict) and GENERATION_KEY in x:
        return GenerationCall.from_dict(x)
    if isinstance(x, dict) and "jit" in x:
        return JitCall.from_dict(x)
    return KernelSpec.from_dict(x)


def item_of_record(spec: Any) -> Item:
    """What a sidecar's recorded spec replays as; ConfigError or ValueError for none."""
    return _item(spec)
