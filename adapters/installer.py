"""``fa4cache.install()``: the store behind FA4's compile caches, with what builds on it.

This module only wires the pieces together: :mod:`.flash_attn` patches FA4's compile caches
(and routes QuACK's), :mod:`.compile_ahead` registers the forward wrapper that starts a
step's backward kernels compiling in the background. The patcher itself imports neither.
"""

from __future__ import annotations

from . import compile_ahead  # noqa: F401  (registers its forward wrapper on import)
from .flash_attn import install, uninstall

__all__ = ["install", "uninstall"]
