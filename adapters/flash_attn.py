"""Route FlashAttention-4's compile caches through the fa4cache store.

FA4 (4.0.0b36) keeps one compile cache per kernel entry point, as a ``compile_cache``
attribute on the function (``_flash_attn_fwd.compile_cache``, ``_bwd_preprocess...``)
and uses it as ``if key not in cache: cache[key] = cute.compile(...)``, then
``cache[key](*args)``. :class:`StoreCompileCache` keeps that protocol:

* ``key in cache`` is a dict lookup when the kernel is in memory (the hot path);
  otherwise it looks in the store, and on a miss takes the key's cross-process lock
  and *keeps holding it*, so that other processes wait for this compile instead of
  repeating it (single-flight).
* ``cache[key] = fn`` exports ``fn``, publishes it atomically and releases the lock.
* A compile that raises releases the lock through a thin guard around the entry
  point, so a failing compile never blocks other processes.

Patching happens when FA4's modules are imported (an import hook), so installing
fa4cache never imports FA4 (about 10 s on a GPU host) by itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fa4cache import counters as _counters
from fa4cache.errors import FA4NotAvailable
from fa4cache.fingerprint import Toolchain, toolchain
from fa4cache.hashing import encode_key, key_digest
from fa4cache.settings import Settings
from fa4cache.store import Artifact, EntryRef, Store

log = logging.getLogger(__name__)

FA4_PACKAGE = "flash_attn.cute"
INTERFACE = "flash_attn.cute.interface"
EXPORT_FUNCTION = "func"
# Entry-point names whose kind reads better short; others use the name without underscores.
_KIND_NAMES = {
    "_flash_attn_fwd": "fwd",
    "_flash_attn_bwd": "bwd",
    "_bwd_preprocess": "bwd_pre",
    "_bwd_postprocess_convert": "bwd_post",
    "_flash_attn_fwd_combine": "fwd_combine",
    "_bwd_dsink_reduce": "bwd_dsink",
    "_flash_attn_bwd_sparse_mla": "bwd_sparse_mla",
}

_tl = threading.local()


def kind_for(name: str) -> str:
    return _KIND_NAMES.get(name, name.strip("_").lower())


@dataclass
class _Pending:
    ref: EntryRef
    encoded: str
    lock: Any
    started: float


class StoreCompileCache:
    """A drop-in for FA4's ``JITCache``, backed by a :class:`~fa4cache.store.Store`."""

    def __init__(self, kind: str, installation: _Installation, seed: dict[Any, Any] | None = None) -> None:
        self.kind = kind
        self._inst = installation
        self.cache: dict[Any, Any] = dict(seed or {})  # named like FA4's JITCache.cache
        self.memory_hits = 0
        self._folded_hits = 0
        self._pending: dict[Any, _Pending] = {}

    # -- the protocol FA4 uses ------------------------------------------------------
    def __contains__(self, key: Any) -> bool:
        if key in self.cache:
            self.memory_hits += 1
            return True
        return self._miss(key)

    def __getitem__(self, key: Any) -> Any:
        return self.cache[key]

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.cache[key] = fn
        pending = self._pending.pop(key, None)
        try:
            self._inst.publish(self, key, fn, pending)
        finally:
            if pending is not None:
                _forget_pending(self, key)
                _release(pending.lock)

    # -- dict conveniences ----------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        # Not self.cache.get: a miss must go through the store (and its lock) like FA4 does.
        return self[key] if key in self else default  # noqa: SIM401

    def __len__(self) -> int:
        return len(self.cache)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.cache)

    def clear(self) -> None:
        """Forget kernels in memory (the store keeps them)."""
        self.cache.clear()

    def fold_hits(self) -> None:
        n = self.memory_hits - self._folded_hits
        if n:
            self._folded_hits += n
            self._inst.store.counters.add_memory_hits(self.kind, n)

    # -- miss path ------------------------------------------------------------------
    def _miss(self, key: Any) -> bool:
        inst = self._inst
        store = inst.store
        encoded = encode_key(key)
        ref = EntryRef(inst.toolchain().id, self.kind, key_digest(inst.toolchain().id, self.kind, encoded))
        if self._try_load(key, ref):
            return True
        lock = store.acquire(ref.digest)
        if lock is not None and self._try_load(key, ref):
            # Another process compiled it while we waited.
            _release(lock)
            return True
        store.counters.add("misses")
        self._pending[key] = _Pending(ref=ref, encoded=encoded, lock=lock, started=time.perf_counter())
        _remember_pending(self, key)
        return False

    def _try_load(self, key: Any, ref: EntryRef) -> bool:
        store = self._inst.store
        t0 = time.perf_counter()
        art = store.load(ref)
        if art is None:
            return False
        try:
            fn = self._inst.load_callable(art)
        except Exception as e:  # an artifact that verifies but does not load is corrupt too
            store.counters.add("corrupt")
            log.warning(
                "fa4cache: cannot load %s entry %s (%s: %s); recompiling",
                ref.kind,
                ref.digest[:16],
                type(e).__name__,
                e,
            )
            if not art.from_base:
                store.quarantine(ref, f"load failed: {type(e).__name__}: {e}")
            return False
        self.cache[key] = fn
        store.counters.add("disk_hits", kind=self.kind)
        store.counters.add("load_seconds", time.perf_counter() - t0)
        store.touch(art)
        store.counters.flush(throttle=1.0)
        return True

    def release_pending(self, key: Any) -> None:
        pending = self._pending.pop(key, None)
        if pending is not None:
            _release(pending.lock)


def _release(lock: Any) -> None:
    if lock is not None:
        try:
            lock.release(force=True)
        except Exception as e:  # never let an unlock failure mask the real outcome
            log.debug("fa4cache: unlock failed: %s", e)


def _remember_pending(cache: StoreCompileCache, key: Any) -> None:
    lst = getattr(_tl, "pending", None)
    if lst is None:
        lst = _tl.pending = []
    lst.append((cache, key))


def _forget_pending(cache: StoreCompileCache, key: Any) -> None:
    lst = getattr(_tl, "pending", None)
    if lst:
        try:
            lst.remove((cache, key))
        except ValueError:
            pass


def _release_thread_pending() -> None:
    lst = getattr(_tl, "pending", None)
    while lst:
        cache, key = lst.pop()
        cache.release_pending(key)


def _guard(fn: Callable[..., Any], cache: StoreCompileCache) -> Callable[..., Any]:
    """Wrap an FA4 entry point: a raising compile must not keep the key locked."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException:
            _release_thread_pending()
            raise

    guarded.__wrapped__ = fn  # type: ignore[attr-defined]
    guarded.__name__ = getattr(fn, "__name__", "guarded")
    guarded.__qualname__ = getattr(fn, "__qualname__", "guarded")
    guarded.__doc__ = getattr(fn, "__doc__", None)
    guarded.__module__ = getattr(fn, "__module__", None)  # type: ignore[assignment]
    guarded.compile_cache = cache  # type: ignore[attr-defined]
    guarded.__fa4cache_guard__ = True  # type: ignore[attr-defined]
    return guarded


@dataclass
class _Patch:
    module: types.ModuleType
    name: str
    original_fn: Any
    original_cache: Any
    cache: StoreCompileCache


@dataclass
class _Installation:
    store: Store
    patches: list[_Patch] = field(default_factory=list)
    _toolchain: Toolchain | None = None
    _private_dir: str | None = None

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
            tc = self._toolchain = toolchain(arch)
            self.store.write_toolchain(tc.id, tc.describe())
        return tc

    def load_callable(self, art: Artifact) -> Any:
        import cutlass.cute as cute

        tvm_ffi = bool(art.sidecar.get("tvm_ffi", True))
        path = art.path
        if art.from_base:
            # A shared base store may change under us: load the bytes we verified, from
            # a private copy, never the shared path itself.
            path = self._private_copy(art)
        try:
            module = cute.runtime.load_module(str(path), enable_tvm_ffi=tvm_ffi)
            return getattr(module, EXPORT_FUNCTION)
        finally:
            if path != art.path:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def _private_copy(self, art: Artifact) -> Path:
        if self._private_dir is None:
            self._private_dir = tempfile.mkdtemp(prefix="fa4cache-")
        p = Path(self._private_dir) / f"{art.ref.digest}.{os.getpid()}.o"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(art.data)
        return p

    def publish(self, cache: StoreCompileCache, key: Any, fn: Any, pending: _Pending | None) -> None:
        store = self.store
        if pending is None:
            # A kernel set without a preceding miss (FA4 paths that compile without asking):
            # still persist it, but only if nobody else is publishing it right now.
            encoded = encode_key(key)
            tc = self.toolchain().id
            ref = EntryRef(tc, cache.kind, key_digest(tc, cache.kind, encoded))
            seconds = None
            lock = store.acquire(ref.digest, timeout=0) if store.writable else None
            try:
                self._export(cache, fn, ref, encoded, seconds)
            finally:
                _release(lock)
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
                fn.export_to_c(object_file_path=str(staged), function_name=EXPORT_FUNCTION)
            except Exception as e:
                try:
                    os.unlink(staged)
                except OSError:
                    pass
                store.counters.add("publish_errors")
                log.warning(
                    "fa4cache: cannot export %s kernel (%s: %s); keeping it in memory only",
                    cache.kind,
                    type(e).__name__,
                    e,
                )
            else:
                meta: dict[str, Any] = {
                    "key": encoded if len(encoded) <= 64 * 1024 else None,
                    "summary": _summary(cache.kind, encoded),
                    "compile_seconds": seconds,
                    "tvm_ffi": "TVMFFI" in type(fn).__name__ or "tvm_ffi" in type(fn).__module__,
                }
                spec = getattr(_tl, "spec", None)
                if spec is not None:
                    meta["spec"] = spec
                store.publish(ref, staged, meta)
        store.flush_touches()
        store.counters.flush()

    def fold_hits(self) -> None:
        for p in self.patches:
            p.cache.fold_hits()


def _summary(kind: str, encoded: str) -> dict[str, Any]:
    """A few human-readable facts from the key text (for ``fa4cache ls``)."""
    import json

    try:
        key = json.loads(encoded)
    except ValueError:
        return {}
    out: dict[str, Any] = {}

    def walk(v: Any) -> Iterator[Any]:
        if isinstance(v, list):
            for x in v:
                yield from walk(x)
        else:
            yield v

    flat = list(walk(key))
    dtypes = [d["type"].rsplit(".", 1)[-1] for d in flat if isinstance(d, dict) and "type" in d]
    if dtypes:
        out["dtype"] = dtypes[0]
    ints = [int(d["i"]) for d in flat if isinstance(d, dict) and "i" in d]
    if kind in ("fwd", "bwd") and len(ints) >= 2:
        hd = [i for i in ints if i in (32, 64, 96, 128, 192, 256)]
        if hd:
            out["head_dim"] = hd[0]
    hashes = [v for v in flat if isinstance(v, str) and len(v) == 64]
    out["mask"] = hashes[0][:12] if hashes else None
    return out


# ---------------------------------------------------------------------- installation

_state_lock = threading.RLock()
_installed: _Installation | None = None
_finder: _PatchingFinder | None = None


def _modules_to_patch() -> list[types.ModuleType]:
    return [m for n, m in list(sys.modules.items()) if n.startswith(FA4_PACKAGE + ".") and m is not None]


def _patch_module(inst: _Installation, module: types.ModuleType) -> int:
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
        setattr(module, name, _guard(obj, cache))
        inst.patches.append(_Patch(module, name, obj, original, cache))
        n += 1
    return n


def _prepare(inst: _Installation, module: types.ModuleType) -> None:
    """Work done once FA4's interface is imported, so that no kernel call pays for it:
    the toolchain fingerprint (FA4 computes its own at import too) and the lock module."""
    if module.__name__ == INTERFACE:
        import filelock  # noqa: F401

        inst.toolchain()


def _patch_loaded(inst: _Installation) -> None:
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


def _fold_all_hits() -> None:
    inst = _installed
    if inst is not None:
        inst.fold_hits()


_counters._pre_flush_hooks.append(_fold_all_hits)


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
        inst = _Installation(store)
        _installed = inst
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
        _release_thread_pending()
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


def installed_store() -> Store | None:
    inst = _installed
    return inst.store if inst is not None else None


def current_toolchain() -> Toolchain | None:
    inst = _installed
    return inst.toolchain() if inst is not None else None


class record_spec:
    """Context manager: entries compiled inside it record ``spec`` (used by ``warm --replay``)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def __enter__(self) -> None:
        self._prev = getattr(_tl, "spec", None)
        _tl.spec = self.spec

    def __exit__(self, *exc: object) -> None:
        _tl.spec = self._prev
