"""Route QuACK's ``@jit_cache`` compile functions into the fa4cache store.

QuACK (``quack-kernels``, a dependency of FA4) caches each compiled kernel in memory and
as an ``.o`` under ``$TMPDIR/<user>/quack_cache``. While fa4cache is installed, every
QuACK ``jit_cache`` wrapper (module functions such as ``quack.rmsnorm._compile_rmsnorm_fwd``
and static methods such as ``CrossEntropy.compile``) is replaced by a
:func:`~fa4cache.adapters.jit.jit_cache.make_wrapper` wrapper sharing its in-memory dict:
misses go to the store (kinds ``quack.rmsnorm_fwd``, ``quack.cross_entropy``, ...) and
QuACK's directory is never written. :func:`disable` puts QuACK's wrappers back.

Only the disk side changes. With QuACK's async compile pool active
(``quack.cache.pool_scope``, its pytest ``--async-compile``), a cold miss is still shipped
to the pool and :class:`quack.cache.CompilePending` raised; the pool's worker compiles
into the store (:func:`_pool_compile`), which is then the rendezvous instead of QuACK's
``.o`` file.

Modules are patched when imported (an import hook), so :func:`enable` never imports
QuACK (2-3 s) by itself.
"""

from __future__ import annotations

import base64
import importlib
import importlib.abc
import importlib.machinery
import logging
import pickle
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from fa4cache.adapters.fa4.import_hook import PostImportHook
from fa4cache.adapters.jit import jit_cache as _jit

from fa4cache.store.paths import EntryRef

log = logging.getLogger(__name__)

PACKAGE = "quack"
JIT_MODULE = "quack.cache.jit"
KIND_PREFIX = "quack."

_lock = threading.RLock()
_enabled = False
_finder: PostImportHook | None = None
# original QuACK wrapper -> ours, and every place one was replaced (to put back).
_routed: dict[int, tuple[Any, Callable[..., Any]]] = {}
_replaced: list[tuple[Any, str, Any]] = []
_warned = False


def _wrapper_code() -> types.CodeType | None:
    """The code object of QuACK's ``jit_cache`` inner wrapper: every QuACK-wrapped
    function shares it, which identifies them without a list of names."""
    jit = sys.modules.get(JIT_MODULE)
    deco = getattr(jit, "jit_cache", None)
    code = getattr(deco, "__code__", None)
    if code is None:
        return None
    for const in code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == "wrapper":
            return const
    return None


def _route(original: Any, code: types.CodeType) -> Callable[..., Any] | None:
    """Our wrapper for a QuACK wrapper (one per original), or None if ``original`` is not one."""
    if getattr(original, "__code__", None) is not code:
        return None
    hit = _routed.get(id(original))
    if hit is not None and hit[0] is original:
        return hit[1]
    fn = original.__wrapped__
    cache = getattr(original, "cache", None)
    wrapper = _jit.make_wrapper(
        fn,
        _jit.kind_for(KIND_PREFIX, fn.__qualname__),
        library=True,
        cache=cache if isinstance(cache, dict) else None,
    )
    state = getattr(wrapper, _jit.JIT_ATTR)
    state.pool_hook = _ship_to_pool
    state.original = original
    state.routed = _is_enabled
    wrapper.__fa4cache_quack_original__ = original  # type: ignore[attr-defined]
    _routed[id(original)] = (original, wrapper)
    return wrapper


def _patch_module(module: types.ModuleType) -> int:
    global _warned
    code = _wrapper_code()
    if code is None:
        if JIT_MODULE in sys.modules and not _warned:
            _warned = True
            log.warning(
                "fa4cache: QuACK's jit_cache layout is not recognised (tested with quack-kernels 0.6.5); "
                "its kernels stay in QuACK's own cache"
            )
        return 0
    n = 0
    for name, obj in list(vars(module).items()):
        routed = _route(obj, code)
        if routed is not None:
            setattr(module, name, routed)
            _replaced.append((module, name, obj))
            n += 1
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            n += _patch_class(obj, code)
    return n


def _patch_class(cls: type, code: types.CodeType) -> int:
    n = 0
    for name, attr in list(vars(cls).items()):
        inner = attr.__func__ if isinstance(attr, staticmethod) else attr
        routed = _route(inner, code)
        if routed is None:
            continue
        setattr(cls, name, staticmethod(routed) if isinstance(attr, staticmethod) else routed)
        _replaced.append((cls, name, attr))
        n += 1
    return n


def _quack_modules() -> list[types.ModuleType]:
    return [
        m
        for n, m in list(sys.modules.items())
        if m is not None and (n == PACKAGE or n.startswith(PACKAGE + ".")) and n != JIT_MODULE
    ]


def enable() -> int:
    """Route every QuACK ``jit_cache`` function (now and as modules are imported); returns
    how many were routed now."""
    global _enabled, _finder
    with _lock:
        _enabled = True
        n = sum(_patch_module(m) for m in _quack_modules())
        if _finder is None:
            _finder = PostImportHook(PACKAGE, _on_quack_import, skip=(JIT_MODULE,))
            _finder.install()
        return n


def disable() -> None:
    """Put QuACK's own wrappers back (kernels compiled meanwhile stay in their shared dicts)."""
    global _enabled, _finder
    with _lock:
        _enabled = False
        if _finder is not None:
            _finder.remove()
            _finder = None
        while _replaced:
            owner, name, original = _replaced.pop()
            setattr(owner, name, original)


def _is_enabled() -> bool:
    return _enabled


# --------------------------------------------------------------------------- import hook


def _on_quack_import(module: types.ModuleType) -> None:
    with _lock:
        if _enabled:
            _patch_module(module)


# --------------------------------------------------------------------------- async pool


def _ship_to_pool(state: _jit.JitState, ref: EntryRef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """With QuACK's compile pool active, a kernel neither in the store nor compiled yet
    goes to the pool, and ``CompilePending`` tells the caller to retry later (QuACK's
    protocol); a failed pool compile falls through to an in-process one."""
    am = sys.modules.get("quack.cache.async_compile")
    pool = am.get_active_pool() if am is not None else None
    if pool is None:
        return
    status, err = pool.poll(ref.digest)
    if status == "pending":
        raise am.CompilePending(ref.digest, state.fn.__qualname__)
    if status != "new":
        if status == "failed":
            log.warning(
                "fa4cache: QuACK pool compile of %s failed (%s); compiling here", state.qualified, err
            )
        return
    store = _jit.current_store()
    if store is None or not store.writable or store.load(ref) is not None:
        return
    fn = state.fn
    if "<locals>" in fn.__qualname__ or fn.__module__ == "__main__":
        return  # a worker cannot find it by name
    try:
        key_b64 = base64.b64encode(pickle.dumps((args, kwargs))).decode("ascii")
    except Exception:
        return
    with am._neutral_main():
        fut = pool._executor.submit(
            _pool_compile, store.settings, _jit.jit_toolchain(), fn.__module__, fn.__qualname__, key_b64
        )
    pool._futures[ref.digest] = fut
    pool.n_submitted += 1
    raise am.CompilePending(ref.digest, fn.__qualname__)


def _pool_compile(settings: Any, tc: Any, module: str, qualname: str, key_b64: str) -> str | None:
    """In a QuACK pool worker: compile one key into the submitter's store, for its
    toolchain. None on success, else the error (QuACK's worker convention)."""
    try:
        from fa4cache.store.store import Store

        _jit._forced_toolchain = tc
        _jit._forced_store = Store(settings)
        enable()
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        args, kwargs = pickle.loads(base64.b64decode(key_b64))
        obj(*args, **kwargs)
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"
