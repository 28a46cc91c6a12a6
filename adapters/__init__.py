"""Adapters that plug fa4cache into other libraries (installed as ``fa4cache.adapters``).

Submodules load on first attribute access (``fa4cache.adapters.transformers.register()``
after a bare ``import fa4cache``), so this package imports nothing heavy by itself.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if __name__ != "fa4cache.adapters":
    # From the repository root, ``import adapters`` would load a second copy of these modules with
    # their own state (installed patches, registries) beside ``fa4cache.adapters``.
    raise ImportError(
        f"import fa4cache.adapters, not {__name__}: this package is installed as fa4cache.adapters"
    )

# The wings: fa4/ (what binds FA4 to the store), jit/ (``jit_cache`` and QuACK), compile/
# (the compile service), transformers/, distributed/ (torchrun jobs), and install/route
# (``install()`` and its state).
_SUBMODULES = ("compile", "distributed", "fa4", "install", "jit", "patch", "route", "transformers")

# The engines' remote tiers register here, from the adapter side (the store names none):
# every process that loads an adapter can run FA4CACHE_DISTRIBUTED=1. Cheap: no torch.
from fa4cache.adapters import distributed as _distributed  # noqa: E402, F401


def __getattr__(name: str) -> _typing.Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({n for n in globals() if not n.startswith("_") and n != "annotations"} | set(_SUBMODULES))
