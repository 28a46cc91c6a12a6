"""A fake compiler for the fast tests: kernels whose "object file" is their own bytes.

What it fakes is only what cannot run here in milliseconds: ``cute.compile`` and the
object loader. The store, its locks, the compile-cache protocol that FA4 uses
(``key in cache`` / ``cache[key] = fn``) and the processes are real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fa4cache.adapters.fa4.compile_cache import StoreCompileCache, guard
from fa4cache.adapters.route import Route

from fa4cache.fingerprint import Toolchain
from fa4cache.store.store import Artifact, Store

TOOLCHAIN = Toolchain("fa4e000000000000cafe", (), "fake", "cp3", "x86_64", 90, ())


class FakeCompiled:
    """A "kernel" that adds ``k`` to its argument."""

    def __init__(self, key: Any) -> None:
        self.key = key

    def __call__(self, x: int) -> int:
        return x + int(self.key)

    def export_to_c(self, object_file_path: str, function_name: str) -> None:
        Path(object_file_path).write_bytes(json.dumps({"key": self.key, "fn": function_name}).encode() * 64)


def fake_export(fn: FakeCompiled, path: Path) -> bool:
    fn.export_to_c(object_file_path=str(path), function_name="func")
    return False


def fake_load(art: Artifact) -> FakeCompiled:
    text = art.data[: len(art.data) // 64]
    return FakeCompiled(json.loads(text)["key"])


def installation(store: Store) -> Route:
    inst = Route(store, loader=fake_load, exporter=fake_export)
    inst._toolchain = TOOLCHAIN
    store.record_toolchain(TOOLCHAIN.id, TOOLCHAIN.describe())
    return inst


class FakeFA4:
    """An FA4-shaped entry point: ``if key not in cache: cache[key] = compile(...)``."""

    def __init__(
        self, store: Store, kind: str = "fwd", compile_seconds: float = 0.0, fail: bool = False
    ) -> None:
        self.compiles = 0
        self.compile_seconds = compile_seconds
        self.fail = fail
        self.cache = StoreCompileCache(kind, installation(store))
        self.call = guard(self._call, self.cache)

    def _call(self, key: int, x: int) -> int:
        if key not in self.cache:
            self.compiles += 1
            time.sleep(self.compile_seconds)
            if self.fail:
                raise RuntimeError("compile failed")
            self.cache[key] = FakeCompiled(key)
        return self.cache[key](x)
