"""fa4cache: a persistent, single-flight kernel cache for FlashAttention-4.

Example::

    import fa4cache
    fa4cache.install()                        # FA4's compile caches now go through the store
    from flash_attn.cute import flash_attn_func

    mask = fa4cache.make_document_mask(cu_seqlens)        # geometry lives in aux tensors
    out = flash_attn_func(q, k, v, **mask)                # compiles once, for every layout

    fa4cache.stats()["compiles"]                           # totals over all processes

``import fa4cache`` is cheap: torch, cutlass, FA4 and Ray are imported only by the
functions that need them.
"""

from __future__ import annotations

import typing as _typing

from .errors import (
    ConfigError,
    Fa4CacheError,
    FA4NotAvailable,
    InsecurePath,
    UnkeyableCode,
    UnstableKeyError,
)
from .settings import Settings, apply_log_level

apply_log_level()  # FA4CACHE_LOG_LEVEL, when set: the fa4cache logger's level (cheap: no import)

__all__ = [
    "ConfigError",
    "FA4NotAvailable",
    "Fa4CacheError",
    "InsecurePath",
    "Settings",
    "UnstableKeyError",
    "Store",
    "install",
    "uninstall",
    "stats",
    "env",
    "make_document_mask",
    "make_draft_block_mask",
    "mask_template",
    "AttentionMask",
    "DocumentMaskBuilder",
    "KernelSpec",
    "WarmPlan",
    "Target",
    "GenerationCall",
    "WarmReport",
    "warm",
    "attention",
    "jit_cache",
    "expect_warm",
    "UnexpectedCompile",
    "UnkeyableCode",
]

# Lazily resolved names: module they live in.
_LAZY = {
    "Store": "fa4cache.store",
    "install": "fa4cache.adapters.install",
    "uninstall": "fa4cache.adapters.install",
    "stats": "fa4cache.store.stats",
    "env": "fa4cache.ray_integration",
    "make_document_mask": "fa4cache.masks",
    "make_draft_block_mask": "fa4cache.masks",
    "mask_template": "fa4cache.masks",
    "AttentionMask": "fa4cache.masks",
    "DocumentMaskBuilder": "fa4cache.masks",
    "KernelSpec": "fa4cache.aot.spec",
    "WarmPlan": "fa4cache.aot.plan",
    "Target": "fa4cache.aot.plan",
    "GenerationCall": "fa4cache.aot.plan",
    "warm": "fa4cache.adapters.compile.runner",
    "WarmReport": "fa4cache.adapters.compile.report",
    "attention": "fa4cache.ops.attention",
    "jit_cache": "fa4cache.adapters.jit.jit_cache",
    "expect_warm": "fa4cache.warmth",
    "UnexpectedCompile": "fa4cache.warmth",
    # The build's version asks git in a checkout: on first use, not at import.
    "__version__": "fa4cache.version",
}

# Subpackages reachable as attributes without an import of their own, as the docs
# write them (``fa4cache.adapters.transformers.register()``).
_SUBMODULES = ("adapters", "ray_integration", "masks", "ops", "store", "aot", "arch")

if _typing.TYPE_CHECKING:
    from fa4cache.adapters.compile.report import WarmReport
    from fa4cache.adapters.compile.runner import warm
    from fa4cache.adapters.install import install, uninstall
    from fa4cache.adapters.jit.jit_cache import jit_cache
    from fa4cache.aot.plan import GenerationCall, Target, WarmPlan
    from fa4cache.aot.spec import KernelSpec
    from fa4cache.ops.attention import attention
    from fa4cache.store.stats import stats
    from fa4cache.store.store import Store
    from fa4cache.warmth import UnexpectedCompile, expect_warm

    from .masks import (
        AttentionMask,
        DocumentMaskBuilder,
        make_document_mask,
        make_draft_block_mask,
        mask_template,
    )
    from .ray_integration import env


def __getattr__(name: str) -> _typing.Any:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"fa4cache.{name}")
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'fa4cache' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The public face: no typing helpers or private names.
    public = {n for n in globals() if not n.startswith("_") and n != "annotations"}
    return sorted(public | set(__all__) | set(_SUBMODULES) | {"__version__"})
