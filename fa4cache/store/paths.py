"""Where things live in a store directory, and the one walk over its entries.

::

    v2/<toolchain>/toolchain.json        what the toolchain id stands for; its mtime is
                                         the toolchain's last use (``prune`` reads it)
    v2/<toolchain>/<kind>/<digest>.o     the artifact (an exported object file)
    v2/<toolchain>/<kind>/<digest>.json  its sidecar, written once: checksum, size, key
    v2/<toolchain>/<kind>/<digest>.use   last use and hit count (rewritten; not trusted for loading)
    locks/<digest>.lock                  per-key lock: single-flight compile + publish
    quarantine/                          entries that failed verification, kept for inspection
    stats/                               per-process counters (see :mod:`fa4cache.store.counters`)

Only validated names (hex digests, toolchain ids, kind names) ever become path
components. Directories are walked without following symlinks: a kind directory that
is a link, or not ours, is skipped, so nothing reads or deletes through it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fa4cache.errors import ConfigError

from .secure_io import TMP_PREFIX, dir_problem, only_me

LAYOUT = "v2"
TOOLCHAIN_FILE = "toolchain.json"
_HEX = re.compile(r"[0-9a-f]{64}")
# A dot separates a namespace (quack.rmsnorm_fwd, jit.<function>); never first, so never "." or "..".
_KIND = re.compile(r"[a-z0-9][a-z0-9_.]{0,63}")
_TC = re.compile(r"[0-9a-f]{8,64}")


def is_digest(text: str) -> bool:
    return _HEX.fullmatch(text) is not None


@dataclass(frozen=True)
class EntryRef:
    """Names one entry: toolchain namespace, kernel kind, key digest."""

    toolchain: str
    kind: str
    digest: str

    def __post_init__(self) -> None:
        # Validated here so that no caller can smuggle a path through a ref.
        if not _TC.fullmatch(self.toolchain):
            raise ConfigError(f"invalid toolchain id {self.toolchain!r}")
        if not _KIND.fullmatch(self.kind):
            raise ConfigError(f"invalid kernel kind {self.kind!r}")
        if not _HEX.fullmatch(self.digest):
            raise ConfigError(f"invalid digest {self.digest!r}")


@dataclass(frozen=True)
class EntryInfo:
    """An artifact found by :meth:`Layout.iter_entries` (size and mtime from lstat)."""

    ref: EntryRef
    size: int
    mtime: float


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def entries_dir(self) -> Path:
        return self.root / LAYOUT

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    @property
    def stats_dir(self) -> Path:
        return self.root / "stats"

    def toolchain_dir(self, toolchain: str) -> Path:
        return self.entries_dir / toolchain

    def kind_dir(self, ref: EntryRef) -> Path:
        return self.entries_dir / ref.toolchain / ref.kind

    def object_path(self, ref: EntryRef) -> Path:
        return self.kind_dir(ref) / f"{ref.digest}.o"

    def sidecar_path(self, ref: EntryRef) -> Path:
        return self.kind_dir(ref) / f"{ref.digest}.json"

    def use_path(self, ref: EntryRef) -> Path:
        return self.kind_dir(ref) / f"{ref.digest}.use"

    # ------------------------------------------------------------------ walking

    def own_dir(self, path: Path) -> bool:
        """Whether ``path`` is a real directory (not a link) owned by us and private."""
        try:
            return dir_problem(path, trusted=only_me(), what="directory") is None
        except OSError:
            return False

    def toolchains(self) -> list[str]:
        try:
            names = os.listdir(self.entries_dir)
        except OSError:
            return []
        return sorted(n for n in names if _TC.fullmatch(n) and self.own_dir(self.entries_dir / n))

    def kinds(self, toolchain: str) -> list[str]:
        tdir = self.toolchain_dir(toolchain)
        try:
            names = os.listdir(tdir)
        except OSError:
            return []
        return sorted(n for n in names if _KIND.fullmatch(n) and self.own_dir(tdir / n))

    def iter_entries(self, *, toolchain: str | None = None, kind: str | None = None) -> Iterator[EntryInfo]:
        """Every artifact under the layout (``<digest>.o``), in trusted directories only."""
        for tc in [toolchain] if toolchain else self.toolchains():
            for k in self.kinds(tc):
                if kind is not None and k != kind:
                    continue
                try:
                    it = os.scandir(self.toolchain_dir(tc) / k)
                except OSError:
                    continue
                with it:
                    for ent in it:
                        name = ent.name
                        if not name.endswith(".o") or not _HEX.fullmatch(name[:-2]):
                            continue
                        try:
                            st = ent.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        yield EntryInfo(EntryRef(tc, k, name[:-2]), st.st_size, st.st_mtime)

    def iter_temp_files(self) -> Iterator[tuple[Path, int]]:
        """Temp files in the entry directories (path, size): publishes in progress, or
        left by writers that were killed (``prune`` and the next publish there remove those)."""
        for tc in self.toolchains():
            tdir = self.toolchain_dir(tc)
            for d in (tdir, *(tdir / k for k in self.kinds(tc))):
                try:
                    it = os.scandir(d)
                except OSError:
                    continue
                with it:
                    for ent in it:
                        if not ent.name.startswith(TMP_PREFIX):
                            continue
                        try:
                            yield Path(ent.path), ent.stat(follow_symlinks=False).st_size
                        except OSError:
                            continue

    def iter_sidecars_without_artifact(self) -> Iterator[EntryRef]:
        for tc in self.toolchains():
            for k in self.kinds(tc):
                kdir = self.toolchain_dir(tc) / k
                try:
                    names = os.listdir(kdir)
                except OSError:
                    continue
                for n in names:
                    stem = n[:-5]
                    if (
                        n.endswith(".json")
                        and _HEX.fullmatch(stem)
                        and not os.path.lexists(kdir / f"{stem}.o")
                    ):
                        yield EntryRef(tc, k, stem)

    # ------------------------------------------------------------------ toolchain use

    def toolchain_last_used(self, toolchain: str) -> float | None:
        try:
            st = os.lstat(self.toolchain_dir(toolchain) / TOOLCHAIN_FILE)
        except OSError:
            return None
        return st.st_mtime if stat.S_ISREG(st.st_mode) else None

    def has_entries(self, toolchain: str) -> bool:
        return next(iter(self.iter_entries(toolchain=toolchain)), None) is not None

    def most_recent_toolchain(self) -> str | None:
        """The toolchain the CLI calls current (``doctor``, ``stats``, ``prune``): the most
        recently used one that holds kernels; else, in a store with none, the most recently
        used one. A process that recorded a toolchain and compiled nothing (a failed or
        arch-less start) does not displace the kernels jobs actually load."""
        used = [(t, tc) for tc in self.toolchains() if (t := self.toolchain_last_used(tc)) is not None]
        with_kernels = [u for u in used if self.has_entries(u[1])]
        pick = with_kernels or used
        return max(pick)[1] if pick else None
