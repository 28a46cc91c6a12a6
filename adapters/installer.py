"""``fa4cache.install()``: the store behind FA4's compile caches, with what builds on it.

This module only wires the pieces together: :mod:`.flash_attn` patches FA4's compile caches
(and routes QuACK's), :mod:`.compile_ahead` registers the forward wrapper that starts a
step's backward kernels compiling in the background, and on a GPU host its compile server
starts here. The patcher itself imports neither.
"""

from __future__ import annotations

from typing import Any

from . import compile_ahead  # registers its forward wrapper on import
from .flash_attn import install as _install_store
from .flash_attn import uninstall

__all__ = ["install", "uninstall"]


def install(cache_dir: Any = None, *, compile_server: bool = True, **options: Any) -> Any:
    store = _install_store(cache_dir, **options)
    if compile_server:  # False: a process that may never compile starts the server at a miss
        compile_ahead.start_server_at_install()
    return store


install.__doc__ = _install_store.__doc__
