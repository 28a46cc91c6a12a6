"""``worker_process_setup_hook``: install the store in a Ray worker.

Imports neither torch nor FA4: FA4 is patched when the worker imports it.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any

from fa4cache.errors import ConfigError
from fa4cache.settings import BY_NAME, DSL_CACHES_OFF, ENV_DIR, Settings, setting

ENV_NODE_LOCAL = BY_NAME["FA4CACHE_NODE_LOCAL"].name
ENV_CHAINED_HOOK = BY_NAME["FA4CACHE_CHAINED_SETUP_HOOK"].name

log = logging.getLogger(__name__)
_warned_network = False


def setup() -> None:
    """Resolve node-local paths, check the directory, install fa4cache, chain the user's hook."""
    global _warned_network
    from fa4cache.adapters.install import install

    from fa4cache.store.fsinfo import is_network_fs, mount_for

    for k, v in DSL_CACHES_OFF.items():  # before FA4 (and the DSL) are imported; a job's own value wins
        os.environ.setdefault(k, v)
    settings = Settings.from_env()
    if setting(ENV_NODE_LOCAL) and is_network_fs(settings.cache_dir) and not _warned_network:
        _warned_network = True
        mnt, fstype = mount_for(settings.cache_dir)
        log.warning(
            "fa4cache: %s=%s is on a network filesystem (%s at %s); file locks there are slow or "
            "unreliable. Use a node-local path such as /var/tmp/fa4cache-{user} or /local/...",
            ENV_DIR,
            settings.cache_dir,
            fstype,
            mnt,
        )
    # Like Store(): a squatted node-local path falls back to the private default, and a
    # store that cannot be written (full disk, read-only) runs memory-only with a warning.
    # No compile server ahead of need: Ray starts idle workers by the dozen, most of which
    # never run FA4 (a worker that misses starts one then).
    store = install(compile_server=False, strict_dir=False)
    if store.writable:
        # Workers and the driver resolve placeholders the same way; export the resolved path
        # so subprocesses of this worker (compile pools) use the same directory.
        os.environ[ENV_DIR] = str(store.root)
    bundle = setting("FA4CACHE_BUNDLE")
    if bundle and store.writable:
        _import_bundle(store, bundle)
    chained = os.environ.get(ENV_CHAINED_HOOK)
    if chained:
        mod, _, fn = chained.rpartition(".")
        if not mod:
            raise ConfigError(f"{ENV_CHAINED_HOOK}: expected 'module.function', got {chained!r}")
        getattr(importlib.import_module(mod), fn)()


def _import_bundle(store: Any, path: str) -> None:
    """Fill the node's store from a bundle file (every worker tries; entries already there are
    skipped). A bad bundle is refused whole, with a warning, whatever the failure: kernels then
    compile as usual, and the worker lives."""
    import dataclasses

    from fa4cache.errors import Fa4CacheError
    from fa4cache.store.bundle import import_bundle
    from fa4cache.store.store import Store

    try:
        # Without the cluster tier: no actor may be created inside a setup hook (Ray aborts the
        # worker). The node's server announces what was imported when the tier first connects.
        r = import_bundle(Store(dataclasses.replace(store.settings, remote_tier=None)), Path(path))
    except (Fa4CacheError, OSError) as e:
        log.warning("fa4cache: FA4CACHE_BUNDLE=%s not imported: %s", path, e)
        return
    except Exception as e:  # a bug of ours on a hostile file: still no reason to lose the worker
        log.warning("fa4cache: FA4CACHE_BUNDLE=%s not imported: %s: %s", path, type(e).__name__, str(e)[:300])
        return
    if r.imported:
        log.info("fa4cache: imported %d kernels from %s into %s", r.imported, path, store.root)


class ChainedHook:
    """Picklable setup hook: install fa4cache, then run the user's own callable hook."""

    def __init__(self, user_hook: Any) -> None:
        self.user_hook = user_hook

    def __call__(self) -> None:
        setup()
        self.user_hook()
