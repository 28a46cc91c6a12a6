"""Stores written through the real Store API (no compile) for the CLI's tests, and the CLI
as a user types it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fa4cache.hashing import encode_key, key_digest
from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Store
from tests.conftest import ROOT

OLD = "0123456789abcdef0123"  # a toolchain other than the current one, holding kernels
EMPTY = "fedcba9876543210fedc"  # one recorded by a process that compiled nothing
DAY = 86400.0


def cli(
    *args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``fa4cache ARGS`` as a user types it (no --cache-dir added)."""
    return subprocess.run(
        [sys.executable, "-m", "fa4cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def publish(store: Store, tc: str, kind: str, n: int, *, spec: Any = None, dtype: str = "bf16") -> EntryRef:
    ref = EntryRef(tc, kind, f"{n:064x}")
    summary = {"dtype": dtype, "head_dim": 128, "mask": "b2f70b3b0552"}
    assert store.publish_bytes(
        ref, b"\x7fELF" + bytes(200 + n), summary=summary, spec=spec, compile_seconds=1.5
    )
    return ref


def publish_keyed(root: Path, tc: str, kind: str, n: int, spec: Any = None) -> EntryRef:
    store = Store.at(root)
    # Filed as compiles file them: the digest is the hash of the key text it carries.
    key = encode_key((kind, n))
    ref = EntryRef(tc, kind, key_digest(tc, kind, key))
    assert store.publish_bytes(
        ref, b"\x7fELF" + bytes(200 + n), key=key, summary={"dtype": "bf16"}, spec=spec
    )
    store.record_toolchain(tc, {"arch": 90, "versions": {"flash-attn-4": "4.0.0b36"}})
    return ref


def age_toolchain(store: Store, tc: str, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(store.layout.toolchain_dir(tc) / "toolchain.json", (t, t))
