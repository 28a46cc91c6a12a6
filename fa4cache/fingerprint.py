"""Toolchain fingerprint: what made a kernel's bytes (the store key), and what loading needs.

A cached object is only valid for the code generator that produced it. What changes the
bytes was measured, not guessed (``benchmarks/results/toolchain_bytes.md``: the same kernel
set compiled while varying one thing at a time):

* **In the key** (:attr:`Toolchain.id`): FA4's version *and* a digest of its
  ``flash_attn/cute`` sources (editable installs and local patches change code without
  changing the version), the same for QuACK and for the CUTLASS DSL's Python (``cutlass/**``), the CUTLASS DSL's version, **the CUDA flavor
  the DSL compiles with** (``cu12``/``cu13``: its own ptxas, so other device code), the host
  machine (the object holds host code), the target arch and SM count, the code-generation
  knobs and patches.
* **Not in the key**, since the bytes are identical: torch's version and build (``+cpu``
  and CUDA builds, 2.11 and 2.13), the Python version (3.10-3.12), tvm-ffi 0.1.14 against
  0.1.15, and which ``nvidia-cutlass-dsl-libs-*`` are installed beyond the one picked.
* **What loading needs** (:attr:`Toolchain.runtime`, recorded with every entry and checked
  at load by :func:`load_problem`): the tvm-ffi ABI (its major.minor) whose symbols the
  object imports. Python and torch are recorded too, as provenance only.

Computed from package metadata and file contents only: no import of torch, cutlass or
FA4, so the CLI can compute it in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
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
# 2: torch, Python and the installed DSL libs left the id; the DSL's CUDA flavor joined it.
FINGERPRINT_FORMAT = 2

# The distributions whose versions go into the key: they generate the code.
CODEGEN_DISTRIBUTIONS = (
    "flash-attn-4",
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-core",
    "quack-kernels",
)
# Recorded with each entry: what loading needs (tvm-ffi's ABI) and provenance.
RUNTIME_DISTRIBUTIONS = ("apache-tvm-ffi", "torch")
DISTRIBUTIONS = CODEGEN_DISTRIBUTIONS + RUNTIME_DISTRIBUTIONS
_CUTLASS_IR = "cutlass._mlir._mlir_libs._cutlass_ir"
_FLAVOR = re.compile(r"^_cutlass_ir\.cu(\d+)\..*\.(?:so|pyd)$")


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
    dsl_source_digest: str = "absent"
    # The CUDA flavor the DSL compiles with ("cu13"): its ptxas makes the device code.
    dsl_cuda: str = "absent"
    # Not in the id: what loading needs (tvm_ffi_abi) and provenance (python, torch).
    runtime: tuple[tuple[str, str], ...] = ()

    def describe(self) -> dict[str, object]:
        return {
            "format": FINGERPRINT_FORMAT,
            "dsl_cuda": self.dsl_cuda,
            "runtime": dict(self.runtime),
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
            "dsl_source_digest": self.dsl_source_digest,
        }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=8)
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
    files = _fa4_files("quack")
    if not files:
        return "absent"
    return _fa4_source_digest_cached(tuple(sorted(files)), "quack/")


def dsl_source_digest() -> str:
    """Digest of every ``cutlass/**/*.py`` file of the installed CUTLASS DSL (as for FA4): its
    Python is the code generator too, and a local patch keeps the version."""
    files = _fa4_files("cutlass")
    if not files:
        return "absent"
    return _fa4_source_digest_cached(tuple(sorted(files)), "/cutlass/")


def _fa4_files(package: str = "flash_attn.cute") -> list[tuple[str, int, int]]:
    """Every ``.py`` file of ``package`` as Python imports it: the directory of the first
    ``package/__init__.py`` on ``sys.path``. Not the parent's ``__path__``: ``flash_attn`` is a
    namespace package, and two copies of FA4 on the path (a wheel laid over a venv) would
    mix two releases' files into one digest. Nothing is imported (``install()`` stays cheap)."""
    mod = sys.modules.get(package)
    origin = getattr(mod, "__file__", None) or _origin_without_import(package)
    if origin is None:
        return []
    out = []
    for dirpath, dirs, names in os.walk(os.path.dirname(origin)):
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


def _origin_without_import(package: str) -> str | None:
    """Where ``package/__init__.py`` would be imported from, found as the path finder finds it
    (a regular parent package anywhere on ``sys.path`` beats namespace portions; a namespace's
    portions are searched in order), without running any of it. Other finders (an editable
    install's hook, a zip): asked through importlib, which may import the parent package."""
    import importlib.util

    parts = package.split(".")
    search = [p or os.getcwd() for p in sys.path if isinstance(p, str)]
    for depth, name in enumerate(parts):
        parent = sys.modules.get(".".join(parts[: depth + 1]))
        if parent is not None and getattr(parent, "__path__", None):
            search = list(parent.__path__)
            continue
        regular = next((d for d in search if os.path.isfile(os.path.join(d, name, "__init__.py"))), None)
        if regular is not None:
            search = [os.path.join(regular, name)]
        else:
            search = [os.path.join(d, name) for d in search if os.path.isdir(os.path.join(d, name))]
        if not search:
            break
    else:
        init = os.path.join(search[0], "__init__.py")
        if len(search) == 1 and os.path.isfile(init):
            return init
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    return spec.origin


def codegen_knobs(environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    env = os.environ if environ is None else environ
    return tuple(
        sorted(
            (k, v)
            for k, v in env.items()
            if k.startswith(_KNOB_PREFIXES) and k not in _IGNORED_KNOBS and not k.startswith("FA4CACHE_")
        )
    )


def _driver_cuda_major() -> int | None:
    """The CUDA version the driver supports (major), as the DSL probes it; None without one."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value // 1000
    except (OSError, AttributeError):
        pass
    return None


@lru_cache(maxsize=4)
def _dsl_cuda_from_files(libs_dir: str, driver: int | None) -> str:
    try:
        names = os.listdir(libs_dir)
    except OSError:
        return "absent"
    flavors = sorted({int(m.group(1)) for n in names if (m := _FLAVOR.match(n))}, reverse=True)
    usable = [f for f in flavors if driver is None or driver >= f]
    return f"cu{usable[0]}" if usable else "absent"


def dsl_cuda() -> str:
    """The CUDA flavor the CUTLASS DSL compiles with in this process (``"cu12"``, ``"cu13"``):
    the one it loaded, else the one it will pick, by its own rule (the newest installed that
    the driver supports; the newest without a driver). No import of cutlass."""
    loaded = getattr(sys.modules.get(_CUTLASS_IR), "__file__", None)
    if loaded and (m := _FLAVOR.match(os.path.basename(loaded))):
        return f"cu{m.group(1)}"
    import importlib.util

    try:
        spec = importlib.util.find_spec("cutlass")
    except (ImportError, ValueError):
        return "absent"
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    libs = os.path.join(list(spec.submodule_search_locations)[0], "_mlir", "_mlir_libs")
    return _dsl_cuda_from_files(libs, _driver_cuda_major())


def _abi(version: str | None) -> str:
    return ".".join((version or "absent").split(".")[:2])


@lru_cache(maxsize=1)
def runtime_facts() -> tuple[tuple[str, str], ...]:
    """What this process would record with an entry it compiles (see the module docstring)."""
    tvm = _version("apache-tvm-ffi")
    return (
        ("python", platform.python_version()),
        ("torch", _version("torch") or "absent"),
        ("tvm_ffi", tvm or "absent"),
        ("tvm_ffi_abi", _abi(tvm)),
    )


def load_problem(recorded: dict[str, object] | None) -> str | None:
    """Why an entry compiled with ``recorded`` runtime facts cannot load here, naming the field,
    or None. Entries without a record (older fa4cache) load as before."""
    if not recorded:
        return None
    theirs = recorded.get("tvm_ffi_abi")
    mine = dict(runtime_facts())["tvm_ffi_abi"]  # (read once: a package's metadata, a ms per load)
    if isinstance(theirs, str) and theirs != mine:
        return (
            f"tvm-ffi ABI {mine} here, {theirs} in the entry (its object imports tvm-ffi's symbols): "
            "install the tvm-ffi the producer had, or compile here"
        )
    return None


def toolchain(
    arch: int | None = None, patches: tuple[tuple[str, str], ...] = (), *, num_sms: int | None = None
) -> Toolchain:
    """The current toolchain. ``arch`` defaults to the one named in the environment;
    ``patches`` are ``(name, source digest)`` of code-generation patches applied to FA4
    in this process (a patched FA4 is another code generator); ``num_sms``: the SM count
    persistent schedulers compile into their grid (the device's, or the cross-compile
    target's)."""
    arch = arch if arch is not None else env_arch()
    cuda = dsl_cuda()
    # The picked flavor's own libraries (its ptxas) generate the device code; the others do not.
    dists = (*CODEGEN_DISTRIBUTIONS, f"nvidia-cutlass-dsl-libs-{cuda}")
    versions = tuple((d, v) for d in dists if (v := _version(d)) is not None)
    src = fa4_source_digest()
    quack_src = quack_source_digest()
    dsl_src = dsl_source_digest()
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    # The host CPU architecture: an aarch64 host (GH200, GB200) cannot load x86-64 objects.
    machine = platform.machine().lower() or "unknown"
    knobs = codegen_knobs()
    patches = tuple(sorted(patches))
    payload = json.dumps(
        {
            "format": FINGERPRINT_FORMAT,
            "v": versions,
            "src": src,
            "machine": machine,
            "arch": arch,
            "knobs": knobs,
            "patches": patches,
            "num_sms": num_sms,
            "quack_src": quack_src,
            "dsl_src": dsl_src,
            "dsl_cuda": cuda,
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
        dsl_source_digest=dsl_src,
        dsl_cuda=cuda,
        runtime=runtime_facts(),
    )
