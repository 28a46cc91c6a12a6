"""A drop-in for FA4's ``JITCache`` backed by the store, with single-flight misses.

FA4 (4.0.0b36, 4.0.0b40) uses each entry point's ``compile_cache`` as ``if key not in cache:
cache[key] = cute.compile(...)``, then ``cache[key](*args)``; 4.0.0b40's backward also asks
``cache.get(key)``, and its autotuner probes ``key in cache`` without storing.
:class:`StoreCompileCache` keeps that protocol:

* ``key in cache`` is a dict lookup when the kernel is in memory (the hot path);
  otherwise it looks in the store, and on a miss takes the key's cross-process lock
  and *keeps holding it*, so that other processes wait for this compile instead of
  repeating it (single-flight);
* ``cache[key] = fn`` exports ``fn``, publishes it atomically and releases the lock;
* ``cache.get(key)`` is ``in`` then ``[]``;
* under FA4's compile-miss probe, ``in`` loads what the store has and takes no lock;
* a compile that raises releases the lock through :func:`guard` around the entry point;
* anything that fails inside fa4cache (a key it cannot encode, a store it cannot read or
  write, a lock) fails open (:mod:`.fail_open`): FA4 compiles as it would alone, and the
  kernel stays in memory.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fa4cache.adapters.fa4 import events, fail_open
from fa4cache.adapters.fa4.events import MissEvent, MissStage
from fa4cache.adapters.fa4.fail_open import Stage
from fa4cache.adapters.fa4.key_names import LazyFieldNames, kind_for  # noqa: F401  (kind_for: imported from here too)

from fa4cache import warmth
from fa4cache.hashing import encode_key, key_digest
from fa4cache.identity import is_memory_only
from fa4cache.patched_code import found_for_loads, found_once
from fa4cache.store import nearmiss
from fa4cache.store.locks import release
from fa4cache.store.paths import EntryRef

if TYPE_CHECKING:
    from fa4cache.fingerprint import Toolchain
    from fa4cache.store import Artifact, Store


class Backend(Protocol):
    """What a compile cache needs from the route that owns it (:class:`fa4cache.adapters.route.Route`)."""

    store: Store
    loader: Callable[[Artifact], Any]

    def toolchain(self) -> Toolchain: ...

    def publish(self, cache: StoreCompileCache, key: Any, fn: Any, pending: Any) -> None: ...


log = logging.getLogger(__name__)
_tl = threading.local()

INTERFACE = "flash_attn.cute.interface"


def fa4_probe_active() -> bool:
    """Whether FA4's compile-miss probe is listening in this context (4.0.0b40's autotuner
    sets ``interface._compile_misses`` to collect the kernels a call would compile)."""
    probe = getattr(sys.modules.get(INTERFACE), "_compile_misses", None)
    return probe is not None and probe.get() is not None


def select(selector: Callable[[StoreCompileCache, Any], bool] | None) -> Any:
    """Set this thread's selector (returns the previous one): for a key not in memory,
    ``selector(cache, key)`` answers ``key in cache`` instead of the miss path. Under
    ``FakeTensorMode`` FA4 never calls a kernel, so answering True skips its compile: this
    is how a kernel set is listed, and one kernel of it compiled alone (.kernel_set)."""
    prev = getattr(_tl, "select", None)
    _tl.select = selector
    return prev


@contextmanager
def ahead_off() -> Iterator[None]:
    """No compile-ahead in this thread (``warm`` compiles the whole set itself)."""
    prev = getattr(_tl, "ahead_off", False)
    _tl.ahead_off = True
    try:
        yield
    finally:
        _tl.ahead_off = prev


def ahead_is_off() -> bool:
    return getattr(_tl, "ahead_off", False)


def _listed(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("fa4cache: this kernel was listed, not compiled; it cannot run")


# Set by adapters/fa4/export_only.py on a kernel it compiled without the DSL's JIT engine: the
# DSL's own compile of it, should the bytes published for it not load when it is called.
RECOMPILE = "__fa4cache_recompile__"
_EXPORT_ONLY_FIX = "set FA4CACHE_EXPORT_ONLY=0: kernels compiled for the store then keep the DSL's JIT engine"
_LISTED = _listed  # what get() returns for a kernel a selector lists without compiling


@dataclass
class _Pending:
    ref: EntryRef
    encoded: str
    lock: Any
    started: float


class StoreCompileCache:
    """A drop-in for FA4's ``JITCache``, backed by a :class:`~fa4cache.store.Store`."""

    def __init__(self, kind: str, installation: Backend, seed: dict[Any, Any] | None = None) -> None:
        self.kind = kind
        self._inst = installation
        self.cache: dict[Any, Any] = dict(seed or {})  # named like FA4's JITCache.cache
        self.memory_hits = 0
        self._folded_hits = 0
        self._pending: dict[Any, _Pending] = {}
        # Keys fa4cache could not encode (fail open): their kernels live in memory only.
        self._unkeyed: set[Any] = set()

    # -- the protocol FA4 uses ------------------------------------------------------
    def __contains__(self, key: Any) -> bool:
        if key in self.cache:
            self.memory_hits += 1
            return True
        sel = getattr(_tl, "select", None)
        if self._kept_in_memory(key):
            # Code no key describes completely (:mod:`fa4cache.adapters.fa4.keys`), or a key
            # fa4cache could not encode: compiled here, never stored, listed or shipped to a
            # compile worker.
            if sel is None:
                warmth.check(self.kind, "its compile key cannot be stored, so it is compiled in memory")
            return sel is not None
        if sel is not None:
            return sel(self, key)
        if fa4_probe_active():
            return self._probe(key)
        return self._miss(key)

    def __getitem__(self, key: Any) -> Any:
        return self.cache[key]

    def __setitem__(self, key: Any, fn: Any) -> None:
        # An engine-less kernel (adapters/fa4/export_only.py, or a cross-compile) never sits in
        # the cache itself: a thread that finds the key, even while it is being published,
        # gets the stand-in, which runs the published bytes or the DSL's own compile again.
        engineless = getattr(fn, "engine", 0) is None
        redo = getattr(fn, RECOMPILE, None) is not None
        if self._kept_in_memory(key, publishing=True):
            # (Patched code found only now, where the check was off for loads: nothing stored.)
            self.release_pending(key)
            self.cache[key] = _LoadsWhenCalled(self, key, fn, None) if engineless and redo else fn
            self._inst.store.counters.add("memory_only_compiles")
            return
        pending = self._pending.pop(_mine(key), None)
        _forget_pending(self, key)
        if engineless and (pending is not None or redo):
            found = (None, pending.ref) if pending is not None else self._encoded(key)
            self.cache[key] = _LoadsWhenCalled(self, key, fn, found[1] if found is not None else None)
            if found is None:  # a key with no encoding (said once, by _encoded): memory only
                self._inst.store.counters.add("memory_only_compiles")
                return
        else:
            self.cache[key] = fn
        try:
            self._inst.publish(self, key, fn, pending)
        except Exception as e:
            fail_open.failed(Stage.STORE_WRITE, e, what=f"a {self.kind} kernel", store=self._inst.store)
        finally:
            if pending is not None:
                release(pending.lock)

    def _kept_in_memory(self, key: Any, *, publishing: bool = False) -> bool:
        # Code of FA4, the DSL or QuACK replaced at run time (checked once, at the first key
        # not in memory): the installed files, which the toolchain id digests, no longer say
        # what is compiled. FA4CACHE_PATCH_CHECK=0 lets loads trust the files, never a publish.
        patched = found_once() if publishing else found_for_loads()
        return is_memory_only(key) or key in self._unkeyed or bool(patched)

    # -- dict conveniences ----------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        # Not self.cache.get: a miss must go through the store (and its lock) like FA4 does.
        if key not in self:
            return default
        # A selector answered "in" for a kernel it lists rather than compiles (.kernel_set):
        # FA4 4.0.0b40's backward asks get() and, under fake tensors, never calls the result.
        return self.cache.get(key, _LISTED)

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
    def entry(self, key: Any) -> tuple[str, EntryRef]:
        """The key's canonical text and its store entry (raises what encoding raises)."""
        encoded = encode_key(key)
        tc = self._inst.toolchain().id
        return encoded, EntryRef(tc, self.kind, key_digest(tc, self.kind, encoded))

    def ref(self, key: Any) -> EntryRef:
        return self.entry(key)[1]

    def _encoded(self, key: Any) -> tuple[str, EntryRef] | None:
        """:meth:`entry`, or None (fail open: the key is then memory-only)."""
        try:
            return self.entry(key)
        except Exception as e:
            self._unkeyed.add(key)
            fail_open.failed(Stage.KEY, e, what=f"a {self.kind} kernel", store=self._inst.store)
            return None

    def _probe(self, key: Any) -> bool:
        """FA4's compile-miss probe (4.0.0b40's ``_needs_compile`` under ``_compile_misses``)
        asks ``key in cache`` and records a miss without ever storing: answer from memory and
        the store, and take no lock that no store would release."""
        found = self._encoded(key)
        return found is not None and self._try_load(key, found[1])

    def _miss(self, key: Any, held: Any = None) -> bool:
        """``held``: the key's lock, already taken by the caller (a claimed kernel)."""
        if _mine(key) in self._pending and _pending_here(self, key):
            # This thread asked already and compiles it (FA4 asked twice before storing): the
            # key's lock is held, and one record of the pending miss is enough.
            release(held)
            return False
        store = self._inst.store
        found = self._encoded(key)
        if found is None:
            release(held)
            return False
        encoded, ref = found
        t0 = time.perf_counter()
        if self._try_load(key, ref, remote=False):
            release(held)
            events.notify(MissEvent(MissStage.LOADED, self.kind, key, ref))
            return True
        lock = held
        if lock is None:
            events.notify(MissEvent(MissStage.WAITING, self.kind, key, ref))
            try:
                lock = store.locks.acquire(ref.digest)
            except Exception as e:
                # No lock: this process compiles without waiting for others (at worst a
                # kernel compiled twice) and still publishes atomically.
                fail_open.failed(Stage.LOCK, e, what=f"a {self.kind} kernel", store=store)
                lock = None
        if (lock is not None or store.remote is not None) and self._try_load(key, ref):
            # Another process compiled it while we waited (or another node has it).
            release(lock)
            events.notify(MissEvent(MissStage.LOADED, self.kind, key, ref, time.perf_counter() - t0))
            return True
        store.counters.add("misses")
        names = LazyFieldNames(self.kind, len(key)) if isinstance(key, tuple) else None
        # warm compiles on purpose (ahead_off): its misses are no news, and no unexpected compile.
        on_purpose = ahead_is_off()
        try:
            # which fields differ (read only where it is logged, or quoted by expect_warm)
            why = nearmiss.report(store, ref, encoded, names, quiet=on_purpose, needed=warmth.mode() != "off")
        except Exception as e:
            fail_open.failed(Stage.STORE_READ, e, what="the near-miss report", store=store)
            why = None
        try:
            if not on_purpose:
                warmth.check(self.kind, why)
        except BaseException:
            release(lock)
            raise
        warmth.note_compile(self.kind, encoded, names)
        self._pending[_mine(key)] = _Pending(ref=ref, encoded=encoded, lock=lock, started=time.perf_counter())
        _remember_pending(self, key)
        events.notify(MissEvent(MissStage.COMPILING, self.kind, key, ref))
        return False

    def _try_load(self, key: Any, ref: EntryRef, *, remote: bool = True) -> bool:
        store = self._inst.store
        t0 = time.perf_counter()
        try:
            art = store.load(ref, remote=remote)
        except Exception as e:
            fail_open.failed(
                Stage.REMOTE if remote and store.remote is not None else Stage.STORE_READ,
                e,
                what=f"a {self.kind} kernel",
                store=store,
            )
            return False
        if art is None:
            return False
        try:
            fn = self._inst.loader(art)
        except Exception as e:
            # Verified bytes that do not load: most often the loader's own trouble (out of
            # memory, a driver error), so a miss, never a quarantine.
            store.counters.add("load_errors")
            log.warning(
                "fa4cache: cannot load %s entry %s (%s: %s); recompiling",
                ref.kind,
                ref.digest[:16],
                type(e).__name__,
                e,
            )
            return False
        self.cache[key] = fn
        try:
            store.counters.add("disk_hits", kind=self.kind)
            store.counters.add("load_seconds", time.perf_counter() - t0)
            store.touch(art)
            store.counters.flush(throttle=1.0)
        except Exception as e:  # bookkeeping only: the kernel is loaded
            fail_open.failed(Stage.STORE_WRITE, e, what="the store's use records", store=store)
        return True

    def release_pending(self, key: Any) -> None:
        """This thread compiles ``key`` no longer (stored or not): its lock goes back."""
        pending = self._pending.pop(_mine(key), None)
        _forget_pending(self, key)
        if pending is not None:
            release(pending.lock)

    def release_all_pending(self) -> None:
        """Every thread's pending misses given up (uninstall): their locks go back."""
        for mine in list(self._pending):
            pending = self._pending.pop(mine, None)
            if pending is not None:
                release(pending.lock)

    def load_published(self, key: Any, ref: EntryRef | None, compiled: Any) -> Any:
        """What runs for ``compiled``, a kernel compiled without the DSL's JIT engine that is
        called (:class:`_LoadsWhenCalled`): the bytes published for it under ``ref``, loaded,
        or else the DSL's own compile of it again; kept in memory under ``key``."""
        why = "it is not in the store (its publish failed)" if ref is not None else "it was not stored"
        try:
            art = self._inst.store.load(ref, remote=False) if ref is not None else None
            if art is not None:
                fn = self._inst.loader(art)
                self.cache[key] = fn
                return fn
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        redo = getattr(compiled, RECOMPILE, None)
        if redo is not None:
            log.warning(
                "fa4cache: a %s kernel compiled only to be exported is called, and its stored copy "
                "cannot be loaded (%s): compiling it again with the DSL's JIT engine. Fix: %s.",
                self.kind,
                why,
                _EXPORT_ONLY_FIX,
            )
            fn = redo()
            self.cache[key] = fn
            return fn
        raise RuntimeError(
            f"fa4cache: this {self.kind} kernel was compiled without the DSL's JIT engine, to run from "
            f"its stored copy, and that copy cannot be loaded ({why}). Fix: {_EXPORT_ONLY_FIX}."
        )


class _LoadsWhenCalled:
    """Stands in the cache for an engine-less kernel: the first call loads the bytes that were
    published for it and runs them; anything else is the compiled function's."""

    def __init__(self, cache: StoreCompileCache, key: Any, fn: Any, ref: EntryRef | None) -> None:
        self._cache, self._key, self._fn, self._ref = cache, key, fn, ref
        self._runs: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._runs is None:
            self._runs = self._cache.load_published(self._key, self._ref, self._fn)
        return self._runs(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        fn = self.__dict__.get("_fn")  # (absent while copy or pickle builds one)
        if fn is None:
            raise AttributeError(name)
        return getattr(fn, name)


def _mine(key: Any) -> tuple[int, Any]:
    """A pending miss's record is this thread's own: where the store gives threads no lock
    between them (read-only, lock timeout), two threads may compile one key at once."""
    return threading.get_ident(), key


def store_miss_pending() -> bool:
    """Whether this thread is compiling a kernel for the store (a miss it answered "compile")."""
    return bool(getattr(_tl, "pending", None))


def pending_kind() -> str | None:
    """The store kind of the kernel this thread compiles for the store now (its latest pending
    miss), or None where the store cannot take it (read-only: nothing would be published)."""
    lst = getattr(_tl, "pending", None)
    if not lst:
        return None
    cache = lst[-1][0]
    # (A patched process keeps its kernels in memory: nothing of it would be published. Asked
    # before a compile of seconds; with FA4CACHE_PATCH_CHECK=0 this is where the walk runs.)
    if not getattr(cache._inst.store, "writable", False) or found_once():
        return None
    return cache.kind


def _pending_here(cache: StoreCompileCache, key: Any) -> bool:
    lst = getattr(_tl, "pending", None)
    return bool(lst) and any(c is cache and k == key for c, k in lst)


def _remember_pending(cache: StoreCompileCache, key: Any) -> None:
    lst = getattr(_tl, "pending", None)
    if lst is None:
        lst = _tl.pending = []
    if not _pending_here(cache, key):
        lst.append((cache, key))


def _forget_pending(cache: StoreCompileCache, key: Any) -> None:
    lst = getattr(_tl, "pending", None)
    if lst:
        try:
            lst.remove((cache, key))
        except ValueError:
            pass


def release_thread_pending() -> None:
    lst = getattr(_tl, "pending", None)
    while lst:
        cache, key = lst.pop()
        cache.release_pending(key)


def guard(fn: Callable[..., Any], cache: StoreCompileCache) -> Callable[..., Any]:
    """Wrap an FA4 entry point: a raising compile must not keep the key locked."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException:
            release_thread_pending()
            raise

    guarded.__wrapped__ = fn  # type: ignore[attr-defined]
    guarded.__name__ = getattr(fn, "__name__", "guarded")
    guarded.__qualname__ = getattr(fn, "__qualname__", "guarded")
    guarded.__doc__ = getattr(fn, "__doc__", None)
    guarded.__module__ = getattr(fn, "__module__", None)  # type: ignore[assignment]
    guarded.compile_cache = cache  # type: ignore[attr-defined]
    guarded.__fa4cache_guard__ = True  # type: ignore[attr-defined]
    return guarded
