"""Sidecars: the write-once record that vouches for an artifact, and its use record.

The sidecar (``<digest>.json``) is written once, when the artifact is published, and
never changes: it holds the checksum and size that a loader checks the artifact's
bytes against, plus facts for ``fa4cache ls``. What changes with use (last use, hit
count) lives in a separate ``<digest>.use`` file, so that recording a use never
rewrites the file that a loader trusts. Both parse strictly: a field of the wrong type
or a non-finite number makes the file invalid, never a crash downstream.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fa4cache.hashing import key_digest, sha256_bytes
from fa4cache.store.paths import EntryRef, is_digest

FORMAT = 2
MAX_SIDECAR_BYTES = 256 * 1024
MAX_ARTIFACT_BYTES = 512 * 1024 * 1024


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _plain(x: Any, depth: int = 0) -> bool:
    """JSON made of short strings, finite numbers, bools, None, lists and string-keyed dicts."""
    if depth > 8:
        return False
    if x is None or isinstance(x, bool) or _finite(x):
        return True
    if isinstance(x, str):
        return len(x) <= 4096
    if isinstance(x, list):
        return len(x) <= 256 and all(_plain(v, depth + 1) for v in x)
    if isinstance(x, dict):
        return len(x) <= 64 and all(isinstance(k, str) and _plain(v, depth + 1) for k, v in x.items())
    return False


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data, parse_constant=lambda c: float("nan"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


@dataclass(frozen=True)
class Sidecar:
    toolchain: str
    kind: str
    digest: str
    size: int
    sha256: str
    created: float
    host: str = ""
    compile_seconds: float | None = None
    tvm_ffi: bool = True
    key: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] | None = None
    # What loading needs and provenance (fingerprint.runtime_facts of the producer): checked
    # at load by fingerprint.load_problem.
    built_with: dict[str, Any] = field(default_factory=dict)
    # Provenance, for people (nothing trusts it): who compiled the kernel, where, with what
    # (kept by every copy), and how this copy arrived (a bundle, a cluster peer).
    origin: dict[str, Any] | None = None
    received: str | None = None

    @classmethod
    def for_data(cls, ref: EntryRef, data: bytes, **facts: Any) -> Sidecar:
        return cls(ref.toolchain, ref.kind, ref.digest, len(data), sha256_bytes(data), **facts)

    @classmethod
    def parse(cls, data: bytes, ref: EntryRef) -> Sidecar | None:
        """The sidecar if ``data`` is a well-formed one for ``ref``, else None."""
        obj = _loads(data)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            return None
        ok = (
            obj.get("toolchain") == ref.toolchain
            and obj.get("kind") == ref.kind
            and obj.get("digest") == ref.digest
            and isinstance(obj.get("size"), int)
            and not isinstance(obj.get("size"), bool)
            and 0 < obj["size"] <= MAX_ARTIFACT_BYTES
            and isinstance(obj.get("sha256"), str)
            and is_digest(obj["sha256"])
            and _finite(obj.get("created"))
            and isinstance(obj.get("host", ""), str)
            and (obj.get("compile_seconds") is None or _finite(obj["compile_seconds"]))
            and isinstance(obj.get("tvm_ffi", True), bool)
            and (obj.get("key") is None or isinstance(obj["key"], str))
            and isinstance(obj.get("summary", {}), dict)
            and _plain(obj.get("summary", {}))
            and (obj.get("spec") is None or (isinstance(obj["spec"], dict) and _plain(obj["spec"])))
            and isinstance(obj.get("built_with", {}), dict)
            and _plain(obj.get("built_with", {}))
            and (obj.get("origin") is None or (isinstance(obj["origin"], dict) and _plain(obj["origin"])))
            and (
                obj.get("received") is None
                or (isinstance(obj["received"], str) and len(obj["received"]) <= 1024)
            )
        )
        if not ok:
            return None
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in obj.items() if k in names})

    def facts(self) -> dict[str, Any]:
        """What a republished copy (fetched from a cluster peer or a bundle) carries over
        (not ``received``: each copy says how it arrived)."""
        return {
            "compile_seconds": self.compile_seconds,
            "tvm_ffi": self.tvm_ffi,
            "key": self.key,
            "summary": dict(self.summary),
            "spec": self.spec,
            "built_with": dict(self.built_with),
            "origin": self.origin,
        }

    def to_bytes(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()

    def matches(self, data: bytes) -> bool:
        return len(data) == self.size and sha256_bytes(data) == self.sha256

    def key_problem(self, *, required: bool) -> str | None:
        """Why this sidecar's key text does not name its entry; None when it does.

        The digest is a hash of the key text, so recomputing it binds the bytes to the key
        they will be loaded for: a copy filed under another key (the causal kernel as the
        ``mask=none`` entry) is refused, whatever its checksum. ``required``: an entry from
        elsewhere (a cluster peer, a bundle, a base store) must carry its key text, since
        without it nothing ties its bytes to its digest. Our own compiles may omit a very
        long key (see ``Route._export``); those never leave this store.
        """
        if self.key is None:
            return "no key text, so nothing binds its bytes to its digest" if required else None
        actual = key_digest(self.toolchain, self.kind, self.key)
        if actual != self.digest:
            return (
                f"its key text hashes to {actual[:16]}, not to its digest {self.digest[:16]} "
                "(bytes filed under another key)"
            )
        return None


@dataclass(frozen=True)
class UseRecord:
    last_used: float
    hits: int = 0

    @classmethod
    def parse(cls, data: bytes) -> UseRecord | None:
        obj = _loads(data)
        if not isinstance(obj, dict):
            return None
        t, h = obj.get("last_used"), obj.get("hits", 0)
        if not _finite(t) or not isinstance(h, int) or isinstance(h, bool) or h < 0:
            return None
        return cls(float(t), h)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()


# CuTe's dtype names -> the names a sidecar's summary, warm, KernelSpec and the CLI use.
_SHORT_DTYPES = {
    "BFloat16": "bf16",
    "Float16": "fp16",
    "Float32": "fp32",
    "Float8E4M3FN": "fp8_e4m3",
    "Float8E5M2": "fp8_e5m2",
}


def short_dtype(name: str) -> str:
    return _SHORT_DTYPES.get(name, name)
