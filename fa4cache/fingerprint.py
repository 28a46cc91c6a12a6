"""Toolchain fingerprint: the namespace that keeps kernels from different toolchains apart.

A cached ``.o`` is only valid for the exact code generator that produced it. The
fingerprint covers FA4's version *and* a digest of its ``flash_attn/cute`` sources
(editable installs and local patches change code without changing the version), the same
for QuACK (FA4's kernels import its helpers, and QuACK's own kernels go through the store), the
CUTLASS DSL and its CUDA library variant, tvm-ffi, torch (its local tag carries the
CUDA build), the Python tag, the target arch, and the environment knobs that change
code generation. Computed from package metadata and file contents only: no import of
torch, cutlass or FA4, so the CLI can compute it in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata

from fa4cache.arch import env_arch

# Knobs that only move files around, log, or pick the arch (the arch is recorded
# resolved, so a CPU cross-compile with FLASH_ATTENTION_ARCH=sm_90 and a real H200
# share entries).
_IGNORED_KNOBS = {
    "FLASH_ATTENTION_ARCH",
    "CUTE_DSL_ARCH",
    "FLASH_ATTENTION_NUM_SMS",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED",
    "CUTE_DSL_DUMP_DIR",
    "CUTE_DSL_KEEP_CUBIN",
    "CUTE_DSL_KEEP_PTX",
    "CUTE_DSL_KEEP_IR",
    "CUTE_DSL_PTXAS_VERBOSE",
    "CUTE_DSL_LOG_LEVEL",
    "CUTE_DSL_LOG_TO_CONSOLE",
    "CUTE_DSL_LOG_TO_FILE",
    "CUTE_DSL_PRINT_IR",
    "CUTE_DSL_CACHE_DIR",
    "CUTE_DSL_FILE_CACHING_CAPACITY",
    "CUTE_DSL_DISABLE_FILE_CACHING",
}
_KNOB_PREFIXES = ("CUTE_DSL_", "FLASH_ATTENTION_", "CUTLASS_")

DISTRIBUTIONS = (
    "flash-attn-4",
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-cu12",
    "nvidia-cutlass-dsl-libs-cu13",
    "apache-tvm-ffi",
    "quack-kernels",
    "torch",
)


@dataclass(frozen=True)
class Toolchain:
    """What the fingerprint is made of; ``id`` names the store namespace."""

    id: str
    versions: tuple[tuple[str, str], ...]
    fa4_source_digest: str
    python: str
    machine: str
    arch: int | None
    knobs: tuple[tuple[str, str], ...]
    patches: tuple[tuple[str, str], ...] = ()
    num_sms: int | None = None
    quack_source_digest: str = "absent"

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id,
            "versions": dict(self.versions),
            "fa4_source_digest": self.fa4_source_digest,
            "python": self.python,
            "machine": self.machine,
            "arch": self.arch,
            "knobs": dict(self.knobs),
            "patches": dict(self.patches),
            "num_sms": self.num_sms,
            "quack_source_digest": self.quack_source_digest,
        }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=4)
def _fa4_source_digest_cached(
    signature: tuple[tuple[str, int, int], ...], marker: str = "flash_attn/cute/"
) -> str:
    h = hashlib.sha256()
    for path, _size, _mtime in signature:
        rel = path.split(marker, 1)[-1]
        h.update(rel.encode() + b"\0")
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(b"<unreadable>")
        h.update(b"\0")
    return h.hexdigest()


def fa4_source_digest() -> str:
    """Digest of every ``flash_attn/cute/**/*.py`` file of the installed FA4.

    Files are found by walking the package directory (no import of FA4, no parse of
    its RECORD); the digest is memoised on their sizes and mtimes.
    """
    files = _fa4_files()
    if not files:
        return "absent"
    return _fa4_source_digest_cached(tuple(sorted(files)))


def quack_source_digest() -> str:
    """Digest of every ``quack/**/*.py`` file of the installed QuACK (as for FA4)."""
    files = _fa4_files("quack", "")
    if not files:
        return "absent"
    return _fa4_source_digest_cached(tuple(sorted(files)), "quack/")


def _fa4_files(package: str = "flash_attn", subdir: str = "cute") -> list[tuple[str, int, int]]:
    import importlib.util

    mod = sys.modules.get(package)
    roots = list(getattr(mod, "__path__", []) or [])
    if not roots:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            return []
        if spec is None or not spec.submodule_search_locations:
            return []
        roots = list(spec.submodule_search_locations)
    out = []
    for root in roots:
        cute_dir = os.path.join(root, subdir) if subdir else root
        for dirpath, dirs, names in os.walk(cute_dir):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for n in names:
                if n.endswith(".py"):
                    p = os.path.join(dirpath, n)
                    try:
                        st = os.stat(p)
                    except OSError:
                        continue
                    out.append((p.replace(os.sep, "/"), st.st_size, st.st_mtime_ns))
    return out


def codegen_knobs(environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    env = os.environ if environ is None else environ
    return tuple(
        sorted(
            (k, v)
            for k, v in env.items()
            if k.startswith(_KNOB_PREFIXES) and k not in _IGNORED_KNOBS and not k.startswith("FA4CACHE_")
        )
    )


def toolchain(
    arch: int | None = None, patches: tuple[tuple[str, str], ...] = (), *, num_sms: int | None = None
) -> Toolchain:
    """The current toolchain. ``arch`` defaults to the one named in the environment;
    ``patches`` are ``(name, source digest)`` of code-generation patches applied to FA4
    in this process (a patched FA4 is another code generator); ``num_sms``: the SM count
    persistent schedulers compile into their grid (the device's, or the cross-compile
    target's)."""
    arch = arch if arch is not None else env_arch()
    versions = tuple((d, v) for d in DISTRIBUTIONS if (v := _version(d)) is not None)
    src = fa4_source_digest()
    quack_src = quack_source_digest()
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    # The host CPU architecture: an aarch64 host (GH200, GB200) cannot load x86-64 objects.
    machine = platform.machine().lower() or "unknown"
    knobs = codegen_knobs()
    patches = tuple(sorted(patches))
    payload = json.dumps(
        {
            "v": versions,
            "src": src,
            "py": py,
            "machine": machine,
            "arch": arch,
            "knobs": knobs,
            "patches": patches,
            "num_sms": num_sms,
            "quack_src": quack_src,
        },
        sort_keys=True,
    ).encode()
    return Toolchain(
        id=hashlib.sha256(payload).hexdigest()[:20],
        versions=versions,
        fa4_source_digest=src,
        python=py,
        machine=machine,
        arch=arch,
        knobs=knobs,
        patches=patches,
        num_sms=num_sms,
        quack_source_digest=quack_src,
    )
