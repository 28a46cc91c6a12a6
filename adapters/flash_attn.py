"""Route FlashAttention-4's compile caches through the fa4cache store: patching and install.

Every FA4 function with a ``compile_cache`` attribute (found generically in
``flash_attn.cute.*``) gets a :class:`~fa4cache.adapters.compile_cache.StoreCompileCache`
and a guard that releases a failed compile's lock; the interface's forward and backward
also fit fa4cache masks to the call's head dim (:mod:`.mask_tiles`). Patching happens when FA4's modules
are imported (an import hook), so ``install()`` never imports FA4 (about 10 s on a GPU
host) by itself. ``install()`` also applies the interval-masking code-generation patch
(:mod:`fa4cache.adapters.fa4_interval_masking`) and registers the store and toolchain
with :mod:`fa4cache.runtime`, where core code finds them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fa4cache import counters as _counters
from fa4cache import runtime
from fa4cache.errors import FA4NotAvailable
from fa4cache.fingerprint import Toolchain, toolchain
from fa4cache.hashing import encode_key, key_digest
from fa4cache.layout import EntryRef
from fa4cache.locks import release
from fa4cache.secure_io import unlink_quiet
from fa4cache.settings import Settings, setting
from fa4cache.store import Artifact, Store

from . import compile_ahead, cross_compile, fa4_interval_masking, mask_tiles
from .artifacts import export, load_callable, summary
from .compile_cache import StoreCompileCache, guard, kind_for, release_thread_pending

log = logging.getLogger(__name__)

FA4_PACKAGE = "flash_attn.cute"
INTERFACE = "flash_attn.cute.interface"


@dataclass
class _Patch:
    module: types.ModuleType
    name: str
    original_fn: Any
    original_cache: Any
    cache: StoreCompileCache


@dataclass
class Installation:
    """One ``install()``: the store, the patched entry points, the toolchain they compile for."""

    store: Store
    patches: list[_Patch] = field(default_factory=list)
    codegen_patches: dict[str, str] = field(default_factory=dict)
    _toolchain: Toolchain | None = None
    # How artifacts become callables and kernels become artifacts: FA4's by default; the
    # fast tests pass a fake compiler's pair (attention-gym's FakeCompiled, same idea).
    loader: Callable[[Artifact], Any] = load_callable
    exporter: Callable[[Any, Any], bool] = export

    def toolchain(self) -> Toolchain:
        tc = self._toolchain
        if tc is None:
            arch = None
            iface = sys.modules.get(INTERFACE)
            if iface is not None and hasattr(iface, "_get_device_arch"):
                try:
                    arch = int(iface._get_device_arch())
                except Exception:  # no GPU and no FLASH_ATTENTION_ARCH: record the arch as unknown
                    arch = None
            tc = self._toolchain = toolchain(
                arch, tuple(self.codegen_patches.items()), num_sms=cross_compile.device_num_sms()
            )
            self.store.record_toolchain(tc.id, tc.describe())
        return tc

    def publish(self, cache: StoreCompileCache, key: Any, fn: Any, pending: Any) -> None:
        store = self.store
        if pending is None:
            # A kernel set without a preceding miss (FA4 paths that compile without asking):
            # still persist it, but only if nobody else is publishing it right now.
            encoded = encode_key(key)
            tc = self.toolchain().id
            ref = EntryRef(tc, cache.kind, key_digest(tc, cache.kind, encoded))
            lock = store.acquire(ref.digest, timeout=0) if store.writable else None
            try:
                self._export(cache, fn, ref, encoded, None)
            finally:
                release(lock)
            return
        seconds = time.perf_counter() - pending.started
        store.counters.add("compiles", kind=cache.kind)
        store.counters.add("compile_seconds", seconds, kind=cache.kind)
        self._export(cache, fn, pending.ref, pending.encoded, seconds)

    def _export(
        self, cache: StoreCompileCache, fn: Any, ref: EntryRef, encoded: str, seconds: float | None
    ) -> None:
        store = self.store
        staged = store.staging_path(ref)
        if staged is not None:
            try:
                tvm_ffi = self.exporter(fn, staged)
            except Exception as e:
                unlink_quiet(staged)
                store.counters.add("publish_errors")
                log.warning(
                    "fa4cache: cannot export %s kernel (%s: %s); keeping it in memory only",
                    cache.kind,
                    type(e).__name__,
                    e,
                )
            else:
                store.publish(
                    ref,
                    staged,
                    key=encoded if len(encoded) <= 64 * 1024 else None,
                    summary=summary(cache.kind, encoded),
                    compile_seconds=seconds,
                    tvm_ffi=tvm_ffi,
                    spec=runtime.recorded_spec(),
                )
        store.flush_touches()
        store.counters.flush()

    def fold_hits(self) -> None:
        for p in self.patches:
            p.cache.fold_hits()


_state_lock = threading.RLock()
_installed: Installation | None = None
_finder: _PatchingFinder | None = None


def _modules_to_patch() -> list[types.ModuleType]:
    return [m for n, m in list(sys.modules.items()) if n.startswith(FA4_PACKAGE + ".") and m is not None]


def _patch_module(inst: Installation, module: types.ModuleType) -> int:
    n = 0
    already = {(id(p.module), p.name) for p in inst.patches}
    for name, obj in list(vars(module).items()):
        if not callable(obj) or not hasattr(obj, "compile_cache") or (id(module), name) in already:
            continue
        if getattr(obj, "__fa4cache_guard__", False):
            continue
        if getattr(obj, "__module__", module.__name__) != module.__name__:
            continue  # imported from elsewhere: patched in its home module
        original = obj.compile_cache
        seed = getattr(original, "cache", original if isinstance(original, dict) else None)
        cache = StoreCompileCache(kind_for(name), inst, seed=dict(seed) if isinstance(seed, dict) else None)
        obj.compile_cache = cache
        patched = guard(obj, cache)
        if module.__name__ == INTERFACE and name in mask_tiles.ENTRY_POINTS:
            patched = mask_tiles.wrap(patched)
            if name == "_flash_attn_fwd":
                patched = compile_ahead.wrap_forward(patched)
        setattr(module, name, patched)
        inst.patches.append(_Patch(module, name, obj, original, cache))
        n += 1
    return n


def _prepare(inst: Installation, module: types.ModuleType) -> None:
    """Work done once FA4's interface is imported, so that no kernel call pays for it:
    the code-generation patches, then the toolchain fingerprint that names them (FA4
    computes its own at import too), and the lock module."""
    if module.__name__ == INTERFACE:
        import filelock  # noqa: F401

        if setting("FA4CACHE_INTERVAL_MASKING") and fa4_interval_masking.enable():
            inst.codegen_patches[fa4_interval_masking.NAME] = fa4_interval_masking.source_digest()
        cross_compile.answer_hardware_queries()
        inst.toolchain()


def _patch_loaded(inst: Installation) -> None:
    for module in _modules_to_patch():
        _patch_module(inst, module)
        _prepare(inst, module)
    iface = sys.modules.get(INTERFACE)
    if iface is not None and not any(p.module is iface for p in inst.patches):
        raise FA4NotAvailable(
            f"{INTERFACE} has no functions with a compile_cache attribute: this FA4 layout is not "
            "recognised by fa4cache (tested with flash-attn-4 4.0.0b36)"
        )


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Patches FA4 modules right after they are imported."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(FA4_PACKAGE + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            original_exec(module)
            with _state_lock:
                if _installed is not None:
                    _patch_module(_installed, module)
                    _prepare(_installed, module)

        # A per-spec proxy loader: the shared loader object is left untouched.
        spec.loader = _LoaderProxy(loader, exec_module)
        return spec


class _LoaderProxy(importlib.abc.Loader):
    def __init__(self, loader: Any, exec_module: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._exec = exec_module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._exec(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def fold_all_hits() -> None:
    inst = _installed
    if inst is not None:
        inst.fold_hits()


_counters._pre_flush_hooks.append(fold_all_hits)


def install(cache_dir: str | os.PathLike[str] | None = None, **options: Any) -> Store:
    """Route every FA4 compile cache through a persistent store; returns the store.

    Idempotent: calling it again with the same settings returns the same store; with
    other settings, the caches are re-routed to the new store. If FA4 is not imported
    yet it is patched when it is, so this call is cheap and never imports FA4.
    ``FA4CACHE_DISABLE=1`` makes it a no-op that still returns a store object.
    """
    global _installed, _finder
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
        inst = Installation(store)
        _installed = inst
        runtime.register(store, inst.toolchain)
        try:
            _patch_loaded(inst)
        except BaseException:
            uninstall()
            raise
        if _finder is None:
            _finder = _PatchingFinder()
            sys.meta_path.insert(0, _finder)
        return store


def uninstall() -> None:
    """Restore FA4's original compile caches and functions (kernels in memory are kept)."""
    global _installed, _finder
    with _state_lock:
        inst = _installed
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
        if inst is None:
            return
        release_thread_pending()
        runtime.unregister()
        inst.fold_hits()
        inst.store.counters.flush()
        for p in reversed(inst.patches):
            for key in list(p.cache._pending):
                p.cache.release_pending(key)
            original = p.original_cache
            # Keep what was compiled meanwhile: FA4's own cache gets the kernels back.
            target = getattr(original, "cache", original if isinstance(original, dict) else None)
            if isinstance(target, dict):
                target.update(p.cache.cache)
            p.original_fn.compile_cache = original
            setattr(p.module, p.name, p.original_fn)
        _installed = None
