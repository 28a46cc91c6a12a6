"""The FA4 releases fa4cache was verified on, and which of its couplings to FA4 are on here.

fa4cache reaches into FA4's internals in a few places: it routes FA4's compile caches
through the store, replaces its callable hash, patches its Hopper masking, replays its decode
launch plans, answers its SM-count query without a GPU and hands its autotuner the store.
Each of those was checked on particular FA4 sources. A coupling is on only where the
installed FA4's sources (:func:`fa4cache.fingerprint.fa4_source_digest`, every
``flash_attn/cute/**/*.py`` file) are those of a release that lists it; on any other FA4,
FA4's own code runs there: nothing is ever wrong, only slower. ``doctor`` says which are off
and why.

Adding a release (docs/fa4-releases.md): install it, run the CPU matrix with
``FA4CACHE_TRY_COUPLINGS=all``, run the GPU checks, then add a :class:`Release` with its digest
and the couplings that passed, and widen the range in ``pyproject.toml``.
"""

from __future__ import annotations

import enum
import functools
import logging
from dataclasses import dataclass

from fa4cache.errors import ConfigError
from fa4cache.settings import setting

log = logging.getLogger(__name__)


class Coupling(str, enum.Enum):
    """One place where fa4cache depends on how FA4 works inside."""

    COMPILE_CACHE = "compile_cache"
    """FA4's entry points' ``compile_cache`` protocol (``in``, ``[]``, ``get``, the
    ``_needs_compile`` probe) routed through the store, its key fields read from its source,
    and its own disk cache closed."""
    HASH = "hash_callable"
    """``flash_attn.cute.utils.hash_callable`` replaced by fa4cache's code identity."""
    INTERVAL_MASKING = "interval_masking"
    """The R2P masking patch of FA4's Hopper ``AttentionMask.apply_mask``."""
    LAUNCH_PLANS = "launch_plans"
    """Decode launches replayed without FA4's per-call planning."""
    CROSS_COMPILE = "cross_compile"
    """The SM-count answer FA4's traces get where no GPU is present."""
    AUTOTUNE = "autotune"
    """FA4's forward autotuner compiling through the store and keeping its winners there."""
    ENGINELESS_FORWARD = "engineless_forward"
    """A forward kernel a GPU process compiles for the store skips the DSL's host JIT engine and
    runs from the bytes it published: FA4's forward calls its kernel through its compile cache
    (``_flash_attn_fwd.compile_cache[key](...)``), where fa4cache stands in for it."""


@dataclass(frozen=True)
class Release:
    version: str
    sources: str  # fa4_source_digest() of the release's wheel
    couplings: frozenset[Coupling]


ALL = frozenset(Coupling)

RELEASES: tuple[Release, ...] = (
    # Autotune: this release has no autotuner.
    Release(
        "4.0.0b36",
        "e4396f5351a9ac6392338500ec58bb19f4c511a697999efcf7fe13084ef764e3",
        ALL - {Coupling.AUTOTUNE},
    ),
    # Launch plans: planned against b36's decode path only (tests/decode/test_launch_plans.py
    # reads helpers b40 removed). Interval masking: shown on the H200 against FA4's
    # element-wise mask_mod and the fp32 reference (benchmarks/results/fa4_releases_h200.md).
    Release(
        "4.0.0b40",
        "ace990a94356ca2f5bcfe8d55365ebfcaa8da376d79684db578250aa06cd924c",
        ALL - {Coupling.LAUNCH_PLANS},
    ),
)

VERSIONS = tuple(r.version for r in RELEASES)


@dataclass(frozen=True)
class Installed:
    """What this process's FA4 is, as far as the couplings are concerned."""

    version: str | None  # the distribution's version, None when FA4 is not installed
    sources: str  # its source digest ("absent" when not installed)
    release: Release | None  # the verified release with these sources, if any

    @property
    def verified(self) -> bool:
        return self.release is not None

    def describe(self) -> str:
        if self.version is None:
            return "flash-attn-4 not installed"
        if self.release is not None:
            return f"flash-attn-4 {self.version} (verified)"
        return (
            f"flash-attn-4 {self.version} (not verified: sources {self.sources[:16]} are none of "
            f"{', '.join(VERSIONS)})"
        )


@functools.lru_cache(maxsize=1)
def _installed(sources: str) -> Installed:
    from importlib import metadata

    version = None
    if sources != "absent":
        try:
            version = metadata.version("flash-attn-4")
        except metadata.PackageNotFoundError:
            version = "unknown"  # sources without a distribution (a checkout on sys.path)
    release = next((r for r in RELEASES if r.sources == sources), None)
    return Installed(version, sources, release)


def installed() -> Installed:
    from fa4cache.fingerprint import fa4_source_digest

    return _installed(fa4_source_digest())


def _tried() -> frozenset[Coupling]:
    raw = setting("FA4CACHE_TRY_COUPLINGS")
    if raw == "all":
        return ALL
    known = {c.value: c for c in Coupling}
    for name in raw:
        if name not in known:
            raise ConfigError(
                f"FA4CACHE_TRY_COUPLINGS: unknown coupling {name!r}; expected 'all' or some of "
                f"{', '.join(sorted(known))}"
            )
    return frozenset(known[n] for n in raw)


_said: set[Coupling] = set()


def on(coupling: Coupling) -> bool:
    """Whether ``coupling`` may run against the installed FA4 (once-per-process note if not)."""
    inst = installed()
    if inst.release is not None and coupling in inst.release.couplings:
        return True
    if coupling in _tried():
        return True
    if coupling not in _said:
        _said.add(coupling)
        log.info("fa4cache: %s is off: %s", coupling.value, why_off(coupling, inst))
    return False


def why_off(coupling: Coupling, inst: Installed | None = None) -> str | None:
    """Why ``coupling`` is off here, or None when it is on (``doctor``)."""
    inst = inst or installed()
    if inst.version is None:
        return "flash-attn-4 is not installed"
    if inst.release is None:
        if coupling in _tried():
            return None
        return (
            f"{inst.describe()}; FA4's own code runs there (FA4CACHE_TRY_COUPLINGS={coupling.value} "
            "turns it on to verify a new release: docs/fa4-releases.md)"
        )
    if coupling in inst.release.couplings or coupling in _tried():
        return None
    return f"not verified on flash-attn-4 {inst.release.version}; FA4's own code runs there"
