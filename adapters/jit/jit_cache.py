"""``@fa4cache.jit_cache``: any CuTe-DSL compile function, cached in the fa4cache store.

Decorate a function that returns a ``cute.compile`` result (QuACK's ``jit_cache``
convention)::

    @fa4cache.jit_cache
    def compile_scale(dtype, n):
        return cute.compile(launch, fake_x(dtype, n), ..., options="--enable-tvm-ffi")

    compile_scale(cutlass.BFloat16, 4096)(x, y)     # compiled once over every process

* A call whose arguments were seen in this process is one dict lookup (as QuACK's).
* Otherwise the key is the function's qualified name, its arguments bound to its
  signature (defaults filled in) and canonically encoded (:func:`fa4cache.hashing.encode_key`),
  and a digest of its source, the user functions it reaches and the global values they
  read, wherever they live (:mod:`fa4cache.identity`, as for masks): a module constant,
  an attribute or a helper the kernel reads gets another entry when it changes, also at
  run time. An argument without a stable encoding raises
  :class:`~fa4cache.errors.UnstableKeyError`; code no key can describe completely (it
  reads an object fa4cache cannot value) compiles in memory only, with one warning.
* Entries go through the store like FA4's (:class:`~fa4cache.adapters.fa4.compile_cache.StoreCompileCache`):
  single-flight across processes, integrity and owner checks, counters by kind
  (``jit.<function>``), prune, base stores. The store is the installed one
  (``fa4cache.install()``), else the one the environment names (``FA4CACHE_DIR``);
  ``FA4CACHE_DISABLE=1`` keeps kernels in memory only.

Kernels are named by their own toolchain (:func:`jit_toolchain`): the arch ``cute.compile``
targets, without FA4's code-generation patches, which do not touch them.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import logging
import os
import re
import sys
import threading
import weakref
from collections import namedtuple
from collections.abc import Callable
from typing import Any

from fa4cache.adapters.fa4 import dsl_caches
from fa4cache.adapters.fa4.compile_cache import StoreCompileCache
from fa4cache.adapters.route import Route

from fa4cache import warmth
from fa4cache.arch import parse_arch, resolved_arch, target_num_sms
from fa4cache.errors import ConfigError, UnkeyableCode, UnstableKeyError
from fa4cache.fingerprint import Toolchain, toolchain
from fa4cache.hashing import encode_key, key_digest
from fa4cache.identity import Identity, current, library_class, value_identity
from fa4cache.settings import Settings, setting
from fa4cache.store import counters as _counters
from fa4cache.store import runtime
from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Store

log = logging.getLogger(__name__)

JIT_ATTR = "__fa4cache_jit__"
CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize"])
_MAX_KIND = 64


# --------------------------------------------------------------------------- kinds


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def kind_for(prefix: str, qualname: str) -> str:
    """A library function's kind, named as QuACK names its kernels: a ``compile`` method by
    its class (``CrossEntropyBackward.compile`` -> ``quack.cross_entropy_backward``), a
    ``_compile_x`` function by ``x`` (``_compile_rmsnorm_fwd`` -> ``quack.rmsnorm_fwd``)."""
    parts = [p for p in qualname.replace("<locals>", "").split(".") if p]
    if len(parts) > 1 and parts[-1] == "compile":
        parts = parts[:-1]
    parts = [re.sub(r"^_*compile_", "", p) for p in parts]
    text = re.sub(r"[^a-z0-9_]+", "_", "_".join(_snake(p) for p in parts)).strip("_") or "fn"
    return (prefix + text)[:_MAX_KIND]


def user_kind(qualname: str) -> str:
    """A ``@fa4cache.jit_cache`` function's kind: ``jit.`` + its qualified name in snake case
    (``compile_rowsum`` -> ``jit.compile_rowsum``, ``RowSum.compile`` -> ``jit.row_sum.compile``)."""
    parts = [p for p in qualname.replace("<locals>", "").split(".") if p]
    text = ".".join(re.sub(r"[^a-z0-9_]+", "_", _snake(p)).strip("_") or "fn" for p in parts) or "fn"
    return ("jit." + text)[:_MAX_KIND]


# --------------------------------------------------------------------------- toolchain

_tc_lock = threading.Lock()
_tc_memo: tuple[tuple[str | None, ...], Toolchain] | None = None
# A QuACK compile-pool worker compiles for its submitter's toolchain (see adapters/jit/quack.py).
_forced_toolchain: Toolchain | None = None
_forced_store: Store | None = None


def dsl_arch() -> int | None:
    """The arch the CuTe DSL compiles for in this process. It latches ``CUTE_DSL_ARCH`` (or
    the GPU's, or its sm_100a default) when first built, so the environment may say otherwise."""
    if "cutlass" not in sys.modules:
        return None
    try:
        from cutlass.cutlass_dsl import CuTeDSL

        return parse_arch(str(CuTeDSL._get_dsl().envar.arch))
    except Exception:
        return None


def target_arch() -> int | None:
    """The arch ``cute.compile`` targets: the one the DSL latched, else :mod:`fa4cache.arch`'s
    answer, else ``QUACK_ARCH`` (QuACK's own cross-compile variable)."""
    return dsl_arch() or resolved_arch() or parse_arch(os.environ.get("QUACK_ARCH"))


def _num_sms(arch: int | None) -> int | None:
    try:
        return target_num_sms(arch)
    except ConfigError:
        return None


def jit_toolchain() -> Toolchain:
    """The toolchain ``jit_cache`` kernels are stored under in this process."""
    global _tc_memo
    if _forced_toolchain is not None:
        return _forced_toolchain
    env = tuple(
        os.environ.get(k)
        for k in ("CUTE_DSL_ARCH", "QUACK_ARCH", "FLASH_ATTENTION_ARCH", "FLASH_ATTENTION_NUM_SMS")
    ) + (str(dsl_arch()),)
    memo = _tc_memo
    if memo is not None and memo[0] == env:
        return memo[1]
    with _tc_lock:
        arch = target_arch()
        quack_arch = os.environ.get("QUACK_ARCH")
        # QUACK_ARCH picks which kernel class QuACK traces; only another code generator
        # when it differs from the target (QuACK's "proxy" runs).
        patches = (("QUACK_ARCH", quack_arch),) if quack_arch and parse_arch(quack_arch) != arch else ()
        tc = toolchain(arch, patches, num_sms=_num_sms(arch))
        _tc_memo = (env, tc)
    return tc


# --------------------------------------------------------------------------- store


_backends: dict[tuple[int, str], Route] = {}
_default_store: tuple[Settings, Store] | None = None
_store_lock = threading.Lock()


def current_store() -> Store | None:
    """The installed store, else the environment's; None when fa4cache is disabled."""
    global _default_store
    store = runtime.installed_store() or _forced_store
    if store is not None:
        return store
    settings = Settings.from_env()
    if settings.disabled:
        return None
    with _store_lock:
        if _default_store is None or _default_store[0] != settings:
            _default_store = (settings, Store(settings))
        return _default_store[1]


def _backend(store: Store) -> Route:
    """An installation for jit kernels (FA4's loader and publisher, the jit toolchain):
    what :class:`StoreCompileCache` works with."""
    tc = jit_toolchain()
    key = (id(store), tc.id)
    b = _backends.get(key)
    if b is None or b.store is not store:
        with _store_lock:
            b = _backends[key] = Route(store, _toolchain=tc)
            store.record_toolchain(tc.id, tc.describe())
    return b


# --------------------------------------------------------------------------- keys


# Named tuples of this module encode under their own type names: never equal to a plain tuple.
_Dataclass = namedtuple("_Dataclass", ["type", "fields"])
_Dict = namedtuple("_Dict", ["items"])
# A value the identity walker valued (a user class, enum, callable, config object): its digest.
_Walked = namedtuple("_Walked", ["digest"])


def _plain(value: Any, where: str, checks: list[Any] | None = None) -> Any:
    """Arguments as values :func:`encode_key` knows: a dataclass of a library's (QuACK's
    frozen configs) becomes its type and fields, a list a tuple, a dict its sorted items.
    Anything the user defined -- a class, an enum member, a dataclass, a config object, a
    callable -- is valued by the identity walker like a global the kernel reads (its class's
    code and values included), never by its type's name. Raises
    :class:`~fa4cache.errors.UnkeyableCode` when the walker cannot value it."""
    if value is None or type(value) in (bool, int, float, str):  # not a user IntEnum member
        return value
    if isinstance(value, type) and library_class(value):
        return value  # cutlass.BFloat16, a library's enum class
    if isinstance(value, enum.Enum) and library_class(type(value)):
        return value
    t = type(value)
    if t.__module__ == "torch" and t.__name__ in ("dtype", "device"):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and library_class(t):
        fields = tuple(
            (f.name, _plain(getattr(value, f.name), f"{where}.{f.name}", checks))
            for f in dataclasses.fields(value)
        )
        return _Dataclass(t, fields)
    if t in (tuple, list):
        return tuple(_plain(v, f"{where}[{i}]", checks) for i, v in enumerate(value))
    if t is dict:
        return _Dict(tuple(sorted((str(k), _plain(v, f"{where}[{k!r}]", checks)) for k, v in value.items())))
    if t is frozenset or (isinstance(value, tuple) and hasattr(value, "_fields") and library_class(t)):
        return value
    ident = value_identity(value, where)
    if checks is not None:
        checks.extend(ident.checks)
    return _Walked(ident.digest)


class JitState:
    """One decorated function: its memory cache and how its misses reach the store."""

    def __init__(self, fn: Callable[..., Any], kind: str, *, library: bool, cache: dict[Any, Any]) -> None:
        self.fn = fn
        self.kind = kind
        # Library code (QuACK) is covered by the toolchain fingerprint; user code by its source digest.
        self.library = library
        self.cache = cache
        self.qualified = f"{fn.__module__}.{fn.__qualname__}"
        self.hits = 0
        self.misses = 0
        self._folded = 0
        self._signature: inspect.Signature | None = None
        # The identity the kernels in ``cache`` were compiled under: a memory hit re-checks it,
        # so a constant changed at run time compiles again instead of reusing the old kernel.
        self.watch: Identity | None = None
        self._arg_checks: list[Any] = []
        self._caches: dict[int, StoreCompileCache] = {}
        self._store: Store | None = None
        self._warned = False
        # Set by the QuACK adapter: ships a miss to QuACK's async compile pool when one is active.
        self.pool_hook: Callable[[JitState, EntryRef, tuple[Any, ...], dict[str, Any]], None] | None = None
        # Set by the QuACK adapter: QuACK's own wrapper, which takes a miss while routing is
        # off (a reference to this wrapper kept past uninstall() must not pick a store itself).
        self.original: Callable[..., Any] | None = None
        self.routed: Callable[[], bool] = lambda: True
        _states.add(self)

    # -- keys ---------------------------------------------------------------------
    def source(self) -> str:
        """The function's code identity as it is now (:mod:`fa4cache.identity`); raises
        :class:`~fa4cache.errors.UnkeyableCode` when no key can describe it."""
        ident = current(self.fn)
        self.watch = ident
        return ident.digest

    def canonical(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The call's store key (before encoding): name, source digest, bound arguments."""
        if self._signature is None:
            self._signature = inspect.signature(self.fn)
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.qualified}: {e}") from None
        bound.apply_defaults()
        items = []
        if self.watch is None or not self.watch.valid():
            self._arg_checks = []  # the memory cache was cleared: its arguments' reads with it
        arg_checks: list[Any] = []
        for name, value in bound.arguments.items():
            try:
                v = _plain(value, name, arg_checks)
            except UnkeyableCode as e:
                # Compiled in memory only (miss): no key can say what this argument is.
                raise UnkeyableCode(
                    f"argument {name!r} ({type(value).__name__}): {e.reason}", name=e.name, fix=e.fix
                ) from None
            try:
                encode_key(v)
            except UnstableKeyError as e:
                raise UnstableKeyError(
                    f"fa4cache.jit_cache({self.qualified}): argument {name!r} ({type(value).__name__}) has no "
                    f"stable encoding; pass numbers, strings, bools, None, types (dtypes), enums or tuples "
                    f"/ frozen dataclasses of them, or objects whose code and values fa4cache can follow ({e})"
                ) from None
            items.append((name, v))
        src = None if self.library else "src:" + self.source()
        if arg_checks:
            # A memory hit re-checks what a walked argument read too (a class attribute changed).
            self._arg_checks.extend(arg_checks)
        if self._arg_checks:
            fn_ident = self.watch or Identity("", ())
            self.watch = Identity(fn_ident.digest, (*fn_ident.checks, *self._arg_checks))
        return (self.qualified, src, tuple(items))

    def entry(self, canonical: tuple[Any, ...]) -> EntryRef:
        tc = jit_toolchain().id
        return EntryRef(tc, self.kind, key_digest(tc, self.kind, encode_key(canonical)))

    # -- miss path ------------------------------------------------------------------
    def miss(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.original is not None and not self.routed():
            return self.original(*args, **kwargs)
        store = current_store()
        if store is None:
            return self._memory_only(key, args, kwargs)
        try:
            canonical = self.canonical(args, kwargs)
        except UnkeyableCode as e:
            if not self._warned:
                self._warned = True
                log.warning("fa4cache: %s compiles in memory only, never stored: %s", self.qualified, e)
            store.counters.add("memory_only_compiles")
            warmth.check(self.kind, f"its code cannot be keyed, so it is never stored ({e})")
            return self._memory_only(key, args, kwargs)
        except UnstableKeyError:
            if not self.library:
                raise
            # A library call that worked before install() keeps working, uncached on disk.
            if not self._warned:
                self._warned = True
                log.warning(
                    "fa4cache: %s key has no stable encoding; compiling it in memory only", self.qualified
                )
            warmth.check(self.kind, "its key has no stable encoding, so it is never stored")
            return self._memory_only(key, args, kwargs)
        if self.pool_hook is not None:
            self.pool_hook(self, self.entry(canonical), args, kwargs)
        sc = self._store_cache(store)
        if canonical in sc:  # in memory under another spelling, in the store, or another process compiled it
            compiled = sc[canonical]
        else:  # we hold the key's lock: compile, then publish (which releases it)
            self.misses += 1
            try:
                compiled = self.fn(*args, **kwargs)
            except BaseException:
                sc.release_pending(canonical)
                raise
            sc[canonical] = compiled
        self._remember(key, compiled)
        return compiled

    def _memory_only(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.misses += 1
        compiled = self.fn(*args, **kwargs)
        self._remember(key, compiled)
        return compiled

    def _remember(self, key: Any, compiled: Any) -> None:
        try:
            self.cache[key] = compiled
        except TypeError:  # a list argument: encodable, not hashable; the store still has it
            pass

    def _store_cache(self, store: Store) -> StoreCompileCache:
        backend = _backend(store)
        sc = self._caches.get(id(backend))
        if sc is None:
            self.fold_hits()  # hits so far belong to the previous store
            sc = self._caches[id(backend)] = StoreCompileCache(self.kind, backend)
            self._store = store
        return sc

    def fold_hits(self) -> None:
        store = self._store
        if store is None:
            return
        n = self.hits - self._folded
        if n:
            self._folded += n
            store.counters.add_memory_hits(self.kind, n)
        for sc in self._caches.values():
            sc.fold_hits()


_states: weakref.WeakSet[JitState] = weakref.WeakSet()


def fold_all_hits() -> None:
    for st in list(_states):
        st.fold_hits()


_counters.before_flush(fold_all_hits)


# --------------------------------------------------------------------------- decorator


def make_wrapper(
    fn: Callable[..., Any], kind: str, *, library: bool, cache: dict[Any, Any] | None = None
) -> Callable[..., Any]:
    """A QuACK-compatible ``jit_cache`` wrapper (``.cache``, ``.cache_clear()``,
    ``.cache_info()``) whose misses go through the store."""
    cache = {} if cache is None else cache
    state = JitState(fn, kind, library=library, cache=cache)

    # The hot path: build the call's key as QuACK does, one dict lookup.
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = args + tuple(sorted(kwargs.items())) if kwargs else args
        try:
            compiled = cache[key]
        except (KeyError, TypeError):  # TypeError: an unhashable argument, judged by the miss path
            return state.miss(key, args, kwargs)
        watch = state.watch
        if watch is not None and not watch.valid():
            cache.clear()  # compiled for code or constants that are no longer there
            return state.miss(key, args, kwargs)
        state.hits += 1
        return compiled

    def cache_clear() -> None:
        """Forget the kernels in memory (the store keeps them)."""
        cache.clear()
        for sc in state._caches.values():
            sc.clear()

    def cache_info() -> CacheInfo:
        return CacheInfo(hits=state.hits, misses=state.misses, maxsize=None, currsize=len(cache))

    functools.update_wrapper(wrapper, fn)
    wrapper.cache = cache  # type: ignore[attr-defined]
    wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
    wrapper.cache_info = cache_info  # type: ignore[attr-defined]
    setattr(wrapper, JIT_ATTR, state)
    return wrapper


def jit_cache(fn: Callable[..., Any] | None = None, *, kind: str | None = None) -> Any:
    """Cache a function returning a ``cute.compile`` result in the fa4cache store.

    Example::

        @fa4cache.jit_cache
        def compile_rowsum(dtype, n_cols):
            return cute.compile(RowSum(dtype, n_cols), *fake_args(dtype, n_cols))

    ``kind`` names the entries in ``stats``/``ls`` (default ``jit.<qualified name>``).
    """

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TypeError(f"fa4cache.jit_cache decorates a function, got {type(f).__name__}")
        k = kind if kind is not None else user_kind(f.__qualname__)
        EntryRef("0" * 20, k, "0" * 64)  # validates the kind now, not at the first miss
        if not setting("FA4CACHE_DISABLE"):
            # As install() does: the DSL's own /tmp file cache is another user's to squat
            # (docs/security.md); this process's kernels are kept in the store instead.
            dsl_caches.close()
        return make_wrapper(f, k, library=False)

    return deco(fn) if fn is not None else deco
