"""Route FlashAttention-4's compile caches through the fa4cache store: patching and install.

Every FA4 function with a ``compile_cache`` attribute (found generically in
``flash_attn.cute.*``) gets a :class:`~fa4cache.adapters.fa4.compile_cache.StoreCompileCache`
and a guard that releases a failed compile's lock; the interface's forward and backward
also fit fa4cache masks to the call's head dim (:mod:`fa4cache.adapters.fa4.mask_tiles`). Patching happens when FA4's modules
are imported (an import hook), so ``install()`` never imports FA4 (about 10 s on a GPU
host) by itself. ``install()`` also applies the interval-masking code-generation patch
(:mod:`fa4cache.adapters.fa4.interval_masking`) and registers the store and toolchain
with :mod:`fa4cache.store.runtime`, where core code finds them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import types
from typing import Any

from fa4cache.adapters.fa4 import autotune as fa4_autotune
from fa4cache.adapters.fa4 import (
    cross_compile,
    dsl_caches,
    events,
    export_only,
    fail_open,
    interval_masking,
    mask_tiles,
)
from fa4cache.adapters.fa4 import keys as fa4_keys
from fa4cache.adapters.fa4.compile_cache import StoreCompileCache, guard, kind_for, release_thread_pending
from fa4cache.adapters.fa4.import_hook import PostImportHook
from fa4cache.adapters.route import Route, _Patch

from fa4cache import fa4_releases, patched_code
from fa4cache.decode.observe import unobserved
from fa4cache.errors import FA4NotAvailable
from fa4cache.fa4_releases import Coupling
from fa4cache.settings import Settings, setting
from fa4cache.store import counters as _counters
from fa4cache.store import runtime
from fa4cache.store.store import Store

log = logging.getLogger(__name__)

FA4_PACKAGE = "flash_attn.cute"
INTERFACE = "flash_attn.cute.interface"


def expected_patches() -> dict[str, str]:
    """The code-generation patches ``install()`` will apply once FA4 is imported, predicted
    without importing it (``doctor``): interval masking when enabled and FA4 is installed.
    (If FA4's layout were unknown to the patch, it would not apply: ``doctor`` says so.)"""
    from fa4cache.extras import missing

    if setting("FA4CACHE_INTERVAL_MASKING") and not missing("flash_attn"):
        return {interval_masking.NAME: interval_masking.source_digest()}
    return {}


_state_lock = threading.RLock()
_installed: Route | None = None
_finder: PostImportHook | None = None


def _modules_to_patch() -> list[types.ModuleType]:
    return [m for n, m in list(sys.modules.items()) if n.startswith(FA4_PACKAGE + ".") and m is not None]


def _patch_module(inst: Route, module: types.ModuleType) -> int:
    if fa4_releases.on(Coupling.HASH):
        inst.hash_patches.extend(fa4_keys.patch_module(module))
    n = 0
    already = {(id(p.module), p.name) for p in inst.patches}
    for name, obj in list(vars(module).items()):
        if not callable(obj) or not hasattr(obj, "compile_cache") or (id(module), name) in already:
            continue
        if getattr(obj, "__fa4cache_guard__", False):
            continue
        if getattr(obj, "__module__", module.__name__) != module.__name__:
            continue  # imported from elsewhere: patched in its home module
        # Not a decode call's planning-time wrapper (another thread may be observing FA4).
        original = unobserved(obj.compile_cache)
        seed = getattr(original, "cache", original if isinstance(original, dict) else None)
        cache = StoreCompileCache(kind_for(name), inst, seed=dict(seed) if isinstance(seed, dict) else None)
        obj.compile_cache = cache
        patched = guard(obj, cache)
        if module.__name__ == INTERFACE and name in mask_tiles.ENTRY_POINTS:
            patched = mask_tiles.wrap(patched)
            if name == "_flash_attn_fwd":
                for wrap in events.forward_wrappers():
                    patched = wrap(patched)
            for wrap_entry in events.entry_wrappers():
                patched = wrap_entry(name, patched)
        setattr(module, name, patched)
        inst.patches.append(_Patch(module, name, obj, original, cache))
        n += 1
    return n


def _prepare(inst: Route, module: types.ModuleType) -> None:
    """Work done once FA4's interface is imported, so that no kernel call pays for it:
    the code-generation patches, then the toolchain fingerprint that names them (FA4
    computes its own at import too), and the lock module."""
    if module.__name__ == INTERFACE:
        import filelock  # noqa: F401

        if setting("FA4CACHE_INTERVAL_MASKING") and interval_masking.enable():
            inst.codegen_patches[interval_masking.NAME] = interval_masking.source_digest()
            # A toolchain asked for before FA4's import (``current_toolchain()`` read early, as
            # a split warm does) did not name this patch: kernels would be stored under an id
            # no patched process looks up. Compute it again.
            inst._toolchain = None
        if fa4_releases.on(Coupling.CROSS_COMPILE):
            cross_compile.answer_hardware_queries()
        export_only.enable()
        inst.toolchain()
        patched_code.warm_up()
    elif module.__name__ == fa4_autotune.MODULE and fa4_releases.on(Coupling.AUTOTUNE):
        fa4_autotune.apply(inst, module)


def _patch_loaded(inst: Route) -> None:
    for module in _modules_to_patch():
        _patch_module(inst, module)
        _prepare(inst, module)
    iface = sys.modules.get(INTERFACE)
    if iface is not None and not any(p.module is iface for p in inst.patches):
        raise FA4NotAvailable(
            f"{INTERFACE} has no functions with a compile_cache attribute: this FA4 layout is not "
            f"recognised by fa4cache (verified: flash-attn-4 {', '.join(fa4_releases.VERSIONS)})"
        )


def _on_fa4_import(module: types.ModuleType) -> None:
    with _state_lock:
        if _installed is None:
            return
        try:
            _patch_module(_installed, module)
            _prepare(_installed, module)
        except Exception as e:
            # Never fail FA4's import: FA4 runs with its own caches from here on.
            fail_open.failed(fail_open.Stage.PATCH, e, what=module.__name__, store=_installed.store)
            uninstall()


def installed_route() -> Route | None:
    """This process's installation (None before ``install()``)."""
    return _installed


def fold_all_hits() -> None:
    inst = _installed
    if inst is not None:
        inst.fold_hits()


_counters.before_flush(fold_all_hits)


def install(cache_dir: str | os.PathLike[str] | None = None, **options: Any) -> Store:
    """Route every FA4 compile cache through a persistent store; returns the store.

    Idempotent: calling it again with the same settings returns the same store; with
    other settings, the caches are re-routed to the new store. If FA4 is not imported
    yet it is patched when it is, so this call is cheap and never imports FA4.
    ``FA4CACHE_DISABLE=1`` makes it a no-op that still returns a store object.
    """
    global _installed, _finder
    dsl_caches.close()  # before FA4 and the DSL are imported here, or by a compile worker
    settings = Settings.from_env(cache_dir, **options)
    with _state_lock:
        if _installed is not None:
            if _installed.store.settings == settings:
                return _installed.store
            uninstall()
        store = Store(settings)
        if settings.disabled:
            log.info("fa4cache: disabled by FA4CACHE_DISABLE")
            return store
        if not fa4_releases.on(Coupling.COMPILE_CACHE):
            _warn_unrouted()
            _route_quack()
            return store
        inst = Route(store)
        _installed = inst
        runtime.register(store, inst.toolchain)
        try:
            _patch_loaded(inst)
        except Exception as e:
            uninstall()
            fail_open.failed(fail_open.Stage.PATCH, e, what="FA4's compile caches", store=store)
            _route_quack()
            return store
        if _finder is None:
            _finder = PostImportHook(FA4_PACKAGE, _on_fa4_import)
            _finder.install()
        _route_quack()
        return store


def _route_quack() -> None:
    from fa4cache.adapters.jit import quack  # QuACK's jit_cache kernels go to the same store

    quack.enable()


def _warn_unrouted() -> None:
    why = fa4_releases.why_off(Coupling.COMPILE_CACHE)
    if why and fa4_releases.installed().version is not None:
        log.warning("fa4cache: FA4's kernels are not stored: %s. `fa4cache doctor` says more.", why)


def uninstall() -> None:
    """Restore FA4's original compile caches and functions (kernels in memory are kept)."""
    global _installed, _finder
    with _state_lock:
        inst = _installed
        if _finder is not None:
            _finder.remove()
            _finder = None
        from fa4cache.adapters.jit import quack

        quack.disable()
        if inst is None:
            return
        release_thread_pending()
        runtime.unregister()
        inst.fold_hits()
        inst.store.counters.flush()
        for p in reversed(inst.patches):
            p.cache.release_all_pending()
            original = p.original_cache
            # Keep what was compiled meanwhile: FA4's own cache gets the kernels back.
            target = getattr(original, "cache", original if isinstance(original, dict) else None)
            if isinstance(target, dict):
                target.update(p.cache.cache)
            p.original_fn.compile_cache = original
            setattr(p.module, p.name, p.original_fn)
        for module, name, original_hash in reversed(inst.hash_patches):
            setattr(module, name, original_hash)
        fa4_autotune.revert()
        _installed = None
