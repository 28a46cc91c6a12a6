"""One installation of the store behind compile caches: where kernels go, how they are
exported and loaded, which toolchain they are filed under.

FA4's entry points (:mod:`fa4cache.adapters.patch`) and ``@fa4cache.jit_cache`` functions
(:mod:`fa4cache.adapters.jit.jit_cache`, QuACK's among them) publish through it.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fa4cache.adapters.fa4.artifacts import export, load_callable
from fa4cache.adapters.fa4.compile_cache import StoreCompileCache
from fa4cache.adapters.fa4.key_names import summary

from fa4cache.arch import num_sms_or_none, resolved_arch
from fa4cache.fingerprint import Toolchain, runtime_facts, toolchain
from fa4cache.store import runtime
from fa4cache.store.locks import release
from fa4cache.store.maintenance import enforce_cap
from fa4cache.store.paths import EntryRef
from fa4cache.store.secure_io import unlink_quiet
from fa4cache.store.store import Artifact, Store

log = logging.getLogger(__name__)


@dataclass
class _Patch:
    module: types.ModuleType
    name: str
    original_fn: Any
    original_cache: Any
    cache: StoreCompileCache


@dataclass
class Route:
    """One ``install()``: the store, the patched entry points, the toolchain they compile for."""

    store: Store
    patches: list[_Patch] = field(default_factory=list)
    codegen_patches: dict[str, str] = field(default_factory=dict)
    # (module, name, FA4's hash_callable) where fa4cache's sound hash replaced it (:mod:`fa4cache.adapters.fa4.keys`)
    hash_patches: list[tuple[types.ModuleType, str, Any]] = field(default_factory=list)
    _toolchain: Toolchain | None = None
    # How artifacts become callables and kernels become artifacts: FA4's by default; the
    # fast tests pass a fake compiler's pair (attention-gym's FakeCompiled, same idea).
    loader: Callable[[Artifact], Any] = load_callable
    exporter: Callable[[Any, Any], bool] = export

    def toolchain(self) -> Toolchain:
        tc = self._toolchain
        if tc is None:
            tc = self._toolchain = job_toolchain(self.codegen_patches)
            if tc.arch is not None:
                # Without a target nothing compiles here: recording the use would make an
                # empty toolchain the store's most recent (doctor, stats, prune).
                self.store.record_toolchain(tc.id, tc.describe())
        return tc

    def publish(self, cache: StoreCompileCache, key: Any, fn: Any, pending: Any) -> None:
        store = self.store
        if pending is None:
            # A kernel set without a preceding miss (FA4 paths that compile without asking):
            # still persist it, but only if nobody else is publishing it right now.
            encoded, ref = cache.entry(key)
            lock = store.locks.acquire(ref.digest, timeout=0) if store.writable else None
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
                try:
                    published = store.publish(
                        ref,
                        staged,
                        key=encoded if len(encoded) <= 64 * 1024 else None,
                        summary=summary(cache.kind, encoded),
                        compile_seconds=seconds,
                        tvm_ffi=tvm_ffi,
                        spec=runtime.recorded_spec(),
                        built_with=dict(runtime_facts()),
                    )
                finally:
                    unlink_quiet(staged)  # gone already once published (renamed into place)
                if published and store.settings.max_size is not None:
                    enforce_cap(store, store.settings.max_size)
        store.flush_touches()
        store.counters.flush()

    def fold_hits(self) -> None:
        for p in self.patches:
            p.cache.fold_hits()


def job_toolchain(codegen_patches: dict[str, str]) -> Toolchain:
    """The toolchain an installed process compiles for: this environment's target arch and
    SM count, with the code-generation patches it applied to FA4."""
    return toolchain(resolved_arch(), tuple(codegen_patches.items()), num_sms=num_sms_or_none())
