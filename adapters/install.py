"""``fa4cache.install()``: the store behind FA4's compile caches, with what builds on it.

This module only wires the pieces together: :mod:`fa4cache.adapters.patch` patches FA4's compile caches
(and routes QuACK's), :mod:`fa4cache.adapters.compile.ahead` registers the forward wrapper that starts a
step's backward kernels compiling in the background, and on a GPU host its compile server
starts here; :mod:`fa4cache.adapters.compile.verify_hits` registers when ``FA4CACHE_VERIFY_HITS``
asks for it. The patcher itself imports neither.
"""

from __future__ import annotations

from typing import Any

from fa4cache.adapters.compile import ahead as compile_ahead  # registers its forward wrapper on import
from fa4cache.adapters.compile import verify_hits
from fa4cache.adapters.patch import install as _install_store
from fa4cache.adapters.patch import uninstall

__all__ = ["install", "uninstall"]


def install(
    cache_dir: Any = None, *, compile_server: bool = True, strict_dir: bool = True, **options: Any
) -> Any:
    # strict_dir=False (the Ray hook): a path known only in the worker (a {node_id}
    # placeholder) that cannot be a directory runs memory-only with a warning, as Store()
    # does, instead of killing the worker in its setup hook.
    if strict_dir:
        _check_cache_dir(cache_dir, options)
    verify_hits.enable()  # before FA4 is patched: its entry points get the wrapper then
    store = _install_store(cache_dir, **options)
    if compile_server:  # False: a process that may never compile starts the server at a miss
        compile_ahead.start_server_at_install()
    return store


install.__doc__ = _install_store.__doc__


def _check_cache_dir(cache_dir: Any, options: dict[str, Any]) -> None:
    """A store path that can never be a directory (a file in the way) is a mistake in the
    job's settings: raise :class:`~fa4cache.errors.ConfigError` naming the setting and the
    fix, at start-up, rather than run a whole job without persisting (one warning). Trouble
    that may pass (a read-only or full disk) still only warns: kernels work, in memory
    (docs/store.md, "An unusable store directory")."""
    from fa4cache.cache_dir import check_cache_dir
    from fa4cache.settings import Settings

    settings = Settings.from_env(cache_dir, **options)
    if not settings.disabled:
        check_cache_dir(settings)
