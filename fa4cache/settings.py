"""Settings: one declaration per environment variable, and everything derived from it.

Every knob is an environment variable so that it crosses process boundaries (torchrun
ranks, Ray workers, compile pools) without code changes. :data:`SETTINGS` declares
each one once (name, parser, default, documentation); :meth:`Settings.from_env`,
:meth:`Settings.job_env`, ``fa4cache env`` and the settings reference (``docs/settings.md``)
all come from it. A bad value is a :class:`~fa4cache.errors.ConfigError` that names the variable.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache_dir import ENV_DIR, default_dir, is_node_local_path, node_local_default, path_text, resolve_path
from .errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
MAX_SIZE_BYTES = 1 << 60  # far past any disk; larger numbers are typos, not caps


# --------------------------------------------------------------------------- parsers


def parse_flag(text: str, *, setting: str) -> bool:
    v = str(text).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{setting}: expected 1/0 (or true/false, yes/no, on/off), got {text!r}")


def parse_seconds(text: str, *, setting: str) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{setting}: expected a number of seconds, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{setting}: expected a finite number of seconds >= 0, got {text!r}")
    return v


def parse_size(text: str, *, setting: str = "size", unit_required: bool = False) -> int:
    """``"2G"``, ``"500M"``, ``"1.5T"``, ``"10B"`` or (unless ``unit_required``) a plain byte
    count, in bytes. Command-line flags require the unit: ``--max-size 2`` read as 2 bytes
    evicts a whole store."""
    m = re.fullmatch(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([KMGTP]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ConfigError(f"{setting}: cannot parse size {text!r} (use e.g. 500M, 2G, 1T)")
    if unit_required and not (m.group(2) or m.group(3)):
        raise ConfigError(
            f"{setting}: {text.strip()!r} has no unit; write it with one, e.g. {setting} {m.group(1)}G "
            "(units: B, K, M, G, T, P)"
        )
    v = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not math.isfinite(v) or v > MAX_SIZE_BYTES:
        raise ConfigError(f"{setting}: size {text!r} is larger than any store can be (max 1024P)")
    return int(v)


def parse_duration(text: str, *, setting: str = "duration") -> float:
    """``"30d"``, ``"12h"``, ``"15m"``, ``"45s"``, ``"2w"``, in seconds. The unit is required:
    ``--older-than 30`` read as seconds evicts a whole store."""
    m = re.fullmatch(r"\s*([0-9]{1,15}(?:\.[0-9]{1,15})?)\s*([smhdw]?)\s*", str(text))
    if not m:
        raise ConfigError(f"{setting}: cannot parse duration {text!r} (use e.g. 45s, 15m, 12h, 30d)")
    if not m.group(2):
        raise ConfigError(
            f"{setting}: {text.strip()!r} has no unit; write it with one, e.g. {setting} {m.group(1)}d "
            "(units: s, m, h, d, w)"
        )
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]


def parse_fraction(text: str, *, setting: str) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{setting}: expected a fraction between 0 and 1 (e.g. 0.01), got {text!r}"
        ) from None
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"{setting}: expected a fraction between 0 and 1 (e.g. 0.01), got {text!r}")
    return v


def parse_choice(*choices: str) -> Callable[..., str]:
    def parse(text: str, *, setting: str) -> str:
        v = str(text).strip().lower()
        if v not in choices:
            raise ConfigError(f"{setting}: expected one of {', '.join(choices)}, got {text!r}")
        return v

    return parse


def parse_count(text: str, *, setting: str) -> int:
    v = str(text).strip()
    if not v.isdigit() or len(v) > 15 or int(v) < 1:
        raise ConfigError(f"{setting}: expected a whole number >= 1, got {text!r}")
    return int(v)


def parse_text(text: str, *, setting: str) -> str:
    return str(text).strip()


def parse_uids(text: str, *, setting: str) -> tuple[int, ...]:
    out = []
    for part in str(text).replace(",", " ").split():
        if not part.isdigit():
            raise ConfigError(f"{setting}: expected numeric uids separated by commas, got {part!r}")
        out.append(int(part))
    return tuple(sorted(set(out)))


def parse_couplings(text: str, *, setting: str) -> str | frozenset[str]:
    """``all`` or names of couplings to FA4 (checked against the list by fa4cache.fa4_releases)."""
    v = str(text).strip().lower()
    if v == "all":
        return "all"
    names = frozenset(p for p in v.replace(",", " ").split() if p)
    bad = sorted(n for n in names if not n.replace("_", "").isalnum())
    if bad:
        raise ConfigError(f"{setting}: expected 'all' or coupling names separated by commas, got {bad[0]!r}")
    return names


def parse_class_path(text: str, *, setting: str) -> str:
    module, _, name = str(text).strip().partition(":")
    if not module or not name.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        raise ConfigError(f"{setting}: expected module:Class, got {text!r}")
    return f"{module}:{name}"


def _node_id() -> str | None:
    # {node_id} in a path: FA4CACHE_NODE_ID (read from os.environ, as the placeholder's doc says).
    return BY_NAME["FA4CACHE_NODE_ID"].read()


def _parse_dir(text: str, *, setting: str) -> Path:
    return resolve_path(text, setting=setting, node_id=_node_id())


def _parse_dirs(text: str, *, setting: str) -> tuple[Path, ...]:
    parts = [p for p in str(text).split(os.pathsep) if p]
    out = []
    for p in parts:
        try:
            out.append(resolve_path(p, setting=setting, node_id=_node_id(), what="base store"))
        except ConfigError as e:
            if len(parts) < 2:
                raise
            # Name the split: "/a:b" is two bases, "/a" and "b", and the second is the bad one.
            raise ConfigError(
                f"{e}; {setting} is split at {os.pathsep!r} into base stores, so {str(text)!r} names "
                f"{' and '.join(repr(x) for x in parts)}, each of which must be an absolute path"
            ) from None
    return tuple(out)


def _no_separator(paths: tuple[Path, ...], *, setting: str) -> None:
    # FA4CACHE_BASE_DIRS is os.pathsep-separated: a base named with one would arrive in
    # the workers as two bases.
    for p in paths:
        if os.pathsep in str(p):
            raise ConfigError(
                f"{setting}: base store {str(p)!r} contains {os.pathsep!r}, which separates base stores "
                f"in FA4CACHE_BASE_DIRS; use a path (or a symlink to it) without {os.pathsep!r}"
            )


# --------------------------------------------------------------------------- the table

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Setting:
    """One environment variable: how to read it, its default, what it means.

    ``field`` names the :class:`Settings` attribute it fills (None: read where it is
    used, e.g. by the mask code); ``job`` marks the ones forwarded to every process of
    a job (``fa4cache env``, the Ray hook), because they change which kernels a
    process asks for or where it keeps them.
    """

    name: str
    parse: Callable[..., Any]
    default: Any
    doc: str
    field: str | None = None
    job: bool = True

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        env = os.environ if environ is None else environ
        raw = env.get(self.name)
        if raw is None or raw.strip() == "":
            return self.default
        return self.parse(raw, setting=self.name)


SETTINGS: tuple[Setting, ...] = (
    Setting(ENV_DIR, _parse_dir, None, "store directory (default `$XDG_CACHE_HOME/fa4cache` or "
            "`~/.cache/fa4cache`); `{hostname}`, `{user}`, `{node_id}` placeholders allowed", "cache_dir"),
    Setting("FA4CACHE_BASE_DIRS", _parse_dirs, (), "read-only base stores tried after the local one "
            "(`:`-separated), e.g. a pre-warmed cache in the image", "base_dirs"),
    Setting("FA4CACHE_LOCK_TIMEOUT", parse_seconds, 600.0, "seconds to wait for another process compiling "
            "the same kernel, then compile anyway with a warning", "lock_timeout"),
    Setting("FA4CACHE_MAX_SIZE", parse_size, None, "size cap (`20G`), enforced on publish (least recently "
            "used first)", "max_size"),
    Setting("FA4CACHE_TRUSTED_UIDS", parse_uids, (), "uids besides yours and root whose base stores are "
            "trusted (`1001,1002`): the owners of a team cache", "trusted_uids"),
    Setting("FA4CACHE_INSECURE", parse_choice("refuse", "warn"), None, "unset: an unsafe store directory is "
            "an error, an unsafe base store is ignored with a warning; `refuse`: both are errors; `warn`: "
            "warnings (the store memory-only, the base ignored)", "insecure_policy"),
    Setting("FA4CACHE_REMOTE_TIER", parse_class_path, None, "a remote store tier, `module:Class`, asked after the local "
            "and base stores (`fa4cache.env(cluster=True)` sets the Ray cluster tier)", "remote_tier"),
    Setting("FA4CACHE_DISTRIBUTED", parse_flag, False, "`1` (or `install(distributed=True)`): once the "
            "default torch.distributed process group exists, a local miss asks the job's c10d store, and "
            "each kernel compiles once per job (docs/distributed.md); ignored if `FA4CACHE_REMOTE_TIER` is set",
            "distributed"),
    Setting("FA4CACHE_CLUSTER_LEASE", parse_seconds, 30.0, "cluster tiers (Ray, torch.distributed): seconds a compile lease "
            "lasts unless its holder renews it (it does, every third of that, while compiling); a dead "
            "holder's lease passes to a waiting node after at most this long"),
    Setting("FA4CACHE_CLUSTER_TIMEOUT", parse_seconds, 10.0, "cluster tiers: seconds any one call to "
            "the registry, a peer or the job's c10d store may take before this process compiles locally (one warning)"),
    Setting("FA4CACHE_JOB_SECRET", parse_text, None, "torch.distributed tier: the secret (16 characters "
            "or more) that the job's ranks authenticate the kernels they share with; set it in the launcher's "
            "environment for multi-node jobs (default: a per-user `job-secret` file, 0600, in the store "
            "directory; see docs/security.md)"),
    Setting("FA4CACHE_BUNDLE", parse_text, None, "a bundle file (`fa4cache bundle export`) that the Ray hook "
            "imports into each node's store at worker start (verified; a bad bundle is refused whole)"),
    Setting("FA4CACHE_BUNDLE_MAX_SIZE", parse_size, 32 << 30, "bundle import: most bytes of artifacts "
            "one bundle may write (summed over its entries, decompressed); a bundle over it is refused "
            "whole, as is one that would write more than 64 times its own size"),
    Setting("FA4CACHE_BUNDLE_MAX_ENTRIES", parse_count, 20000, "bundle import: most entries one bundle "
            "may hold (a kernel set is 4)"),
    Setting("FA4CACHE_BUNDLE_MAX_MANIFEST", parse_size, 64 << 20, "bundle import: largest manifest "
            "(decompressed JSON; a few KiB per entry)"),
    Setting("FA4CACHE_DISABLE", parse_flag, False, "`1`: `install()` does nothing", "disabled"),
    Setting("FA4CACHE_LOG_LEVEL", parse_choice(*LOG_LEVELS), None, "level of the `fa4cache` logger: "
            "`debug`, `info`, `warning`, `error` (unset: the CLI shows warnings, `-v` info, `-q` errors only; "
            "in a job, the `fa4cache` logger follows Python's logging configuration); the CLI's `-v`/`-q` "
            "win over it ([logging](cli.md#logging))"),
    Setting("FA4CACHE_NODE_ID", parse_text, None, "the `{node_id}` placeholder (default: the Ray node id, "
            "else the hostname)", job=False),
    Setting("FA4CACHE_NODE_LOCAL", parse_flag, False, "set by the Ray hook (`1`): the store is meant to "
            "be node-local; a network filesystem there gets a warning", job=False),
    Setting("FA4CACHE_CHAINED_SETUP_HOOK", parse_text, None, "set by the Ray hook: your own "
            "`worker_process_setup_hook` (`module.function`), run after fa4cache's", job=False),
    Setting("FA4CACHE_INTERVAL_MASKING", parse_flag, True, "`0`: built-in masks use FA4's per-score "
            "`mask_mod` path for partial tiles instead of per-row R2P masks (slower; for comparison)"),
    Setting("FA4CACHE_EXPORT_ONLY", parse_flag, True, "`0`: kernels compiled for the store keep the "
            "DSL's host JIT engine (by default a process that sees no GPU skips it for the kernels it only "
            "exports, and a GPU process for its forward, which then runs from the bytes it published: the "
            "same bytes, about 0.3 s less per kernel)"),
    Setting("FA4CACHE_GC_DEFER", parse_flag, True, "`0`: a kernel compiled for the store runs with the "
            "garbage collector as it is (by default no full collection starts during the compile, young ones "
            "go on: a full one walks the whole heap, 0.2 s a time on an H100 host; it runs after)"),
    Setting("FA4CACHE_COMPILE_AHEAD", parse_flag, True, "`0`: no background compiles (a forward miss "
            "starts its backward kernels in CPU worker processes; a transformers model starts its "
            "kernel set at load)"),
    Setting("FA4CACHE_PATCH_CHECK", parse_flag, True, "`0`: loads skip the run-time patch check: a "
            "process's first kernel loads without waiting for it (about 20 ms on an H200 host), trusting that "
            "FA4's, the DSL's and QuACK's code is what their installed files say; code replaced at run time "
            "(`module.fn = my_fix`) then loads the unpatched code's kernels in that process. A publish still "
            "takes the check, so a patched process never stores a kernel for others. `1` (default): a patched "
            "process keeps every kernel in memory ([store](store.md))"),
    Setting("FA4CACHE_VERIFY_HITS", parse_fraction, 0.0, "a fraction (`0.01`): that share of the kernels "
            "loaded from the store (disk or remote hits) is compiled again by a background compile worker "
            "and compared byte for byte; an entry that differs is quarantined, warned about and counted "
            "(`verify_mismatches` in `fa4cache stats`). `0` (default): off, nothing is started "
            "([store](store.md#spot-checking-hits))"),
    Setting("FA4CACHE_EXPECT_WARM", parse_choice("0", "1", "warn", "error"), "0", "`1`/`warn`: every "
            "kernel compile is a warning naming the kernel and why it missed (zero JIT after warm-up); "
            "`error`: it raises `UnexpectedCompile` instead (also `with fa4cache.expect_warm():`)"),
    Setting("FA4CACHE_TRITON", parse_flag, True, "`0`: build block-sparse metadata and a decode "
            "step's key ranges with PyTorch ops instead of the fused Triton kernels"),
    Setting("FA4CACHE_TRY_COUPLINGS", parse_couplings, frozenset(), "couplings to FA4's internals to "
            "turn on for an FA4 whose sources fa4cache has not verified them on (`all`, or names such as "
            "`compile_cache,interval_masking`): for checking a new FA4 release, never for production "
            "([FA4 releases](fa4-releases.md))"),
    Setting("FA4CACHE_LAUNCH_PLANS", parse_flag, True, "`0`: FA4 plans every KV-cache attention call "
            "itself (by default a call whose kind it planned before replays that launch: "
            "fa4cache.decode.launch_plans)", job=False),
    Setting("FA4CACHE_DECODE_SPLIT", parse_flag, True, "`0`: a compiled decode step (torch.compile, "
            "CUDA graphs) calls FA4 once over each sequence's whole cache (by default a long cache at "
            "small batch is split in chunks over more SMs and combined: fa4cache.decode.split_kv)"),
    Setting("FA4CACHE_ONE_ROW_SDPA", parse_flag, True, "`0`: an eager decode step of one sequence with "
            "no padding runs on FA4 too (by default it runs on PyTorch's SDPA kernel, as transformers' "
            "sdpa does: at one row FA4's launch from Python costs more host time than its kernel saves; "
            "fa4cache.decode.one_row_sdpa)"),
)  # fmt: skip
BY_NAME = {s.name: s for s in SETTINGS}
REMOVED_TRUST_SHARED = "FA4CACHE_TRUST_SHARED"


def setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of one declared variable (its default when unset)."""
    return BY_NAME[name].read(environ)


@dataclass(frozen=True)
class DecodeSwitches:
    """The decode path's three switches (:func:`fa4cache.decode.choose.choose` reads them),
    read once a process (:func:`decode_switches`): looking up an unset variable in
    ``os.environ`` raises and catches a KeyError, microseconds in every decode layer."""

    one_row_sdpa: bool = True  # FA4CACHE_ONE_ROW_SDPA
    split: bool = True  # FA4CACHE_DECODE_SPLIT
    launch_plans: bool = True  # FA4CACHE_LAUNCH_PLANS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DecodeSwitches:
        return cls(*(bool(setting(name, environ)) for name in DECODE_SWITCHES))


DECODE_SWITCHES = ("FA4CACHE_ONE_ROW_SDPA", "FA4CACHE_DECODE_SPLIT", "FA4CACHE_LAUNCH_PLANS")
_decode_switches: list[DecodeSwitches] = []  # [the switches], once read


def decode_switches() -> DecodeSwitches:
    """The decode switches as this process read them, at its first decode call or at the
    last :func:`reread_decode_switches` (a change of ``os.environ`` in between is not seen)."""
    if not _decode_switches:
        _decode_switches.append(DecodeSwitches.from_env())
    return _decode_switches[0]


def reread_decode_switches() -> DecodeSwitches:
    """Read the decode switches from ``os.environ`` again (after changing them in-process)."""
    _decode_switches[:] = [DecodeSwitches.from_env()]
    return _decode_switches[0]


def apply_log_level(environ: Mapping[str, str] | None = None) -> str | None:
    """``FA4CACHE_LOG_LEVEL``, when set, for the ``fa4cache`` logger of this process
    (``import fa4cache`` calls this): its level, and, where nothing is configured to show
    its records (no handler on it or on the root logger), one stderr handler of its own.
    A bad value is one warning and no change (a log setting never stops a job). Returns
    the level applied, or None."""
    import logging

    logger = logging.getLogger("fa4cache")
    try:
        level = setting("FA4CACHE_LOG_LEVEL", environ)
    except ConfigError as e:
        logger.warning("fa4cache: %s; logging unchanged", e)
        return None
    if level is None:
        return None
    logger.setLevel(level.upper())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # a root handler configured later would print each record twice
    return str(level)


def markdown_table() -> str:
    """The settings table of docs/settings.md (written there at build time by scripts/docs_hooks.py)."""
    rows = ["| variable | meaning |", "|---|---|"]
    rows += [f"| `{s.name}` | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)


# FA4's own disk cache (it would store every kernel a second time) and the CuTe DSL's
# (under $TMPDIR/$USER, a directory it makes without checking who owns it) are off in a job.
DSL_CACHES_OFF = {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0", "CUTE_DSL_DISABLE_FILE_CACHING": "1"}

# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """Resolved store settings. Build with :meth:`from_env` or :func:`dataclasses.replace`."""

    cache_dir: Path
    base_dirs: tuple[Path, ...] = ()
    lock_timeout: float = 600.0
    max_size: int | None = None
    trusted_uids: tuple[int, ...] = ()
    insecure_policy: str | None = None  # None: the store refused, a base ignored (warned)
    remote_tier: str | None = None
    distributed: bool = False  # the torch.distributed tier when remote_tier is unset
    disabled: bool = False
    # A per-node path (placeholders, FA4CACHE_NODE_LOCAL=1, the node-local default): if
    # another user squatted it, the private default is used instead (fa4cache.store.root).
    node_local: bool = False
    # Where cache_dir came from, as the user would write it ("FA4CACHE_DIR", "--cache-dir",
    # "cache_dir", "default"): an error about the directory names what to change.
    cache_dir_from: str = dataclasses.field(default="default", compare=False)

    def with_cache_dir(self, cache_dir: Path) -> Settings:
        return dataclasses.replace(self, cache_dir=cache_dir)

    @classmethod
    def from_env(
        cls,
        cache_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        cache_dir_from: str = "cache_dir",
        **overrides: Any,
    ) -> Settings:
        """Settings from the environment, then ``cache_dir`` and ``overrides`` (the
        same names as the fields; strings are parsed like the variables).
        ``cache_dir_from``: how the caller calls ``cache_dir`` (the CLI: ``--cache-dir``)."""
        env = os.environ if environ is None else environ
        if env.get(REMOVED_TRUST_SHARED):
            raise ConfigError(
                f"{REMOVED_TRUST_SHARED} was removed: it trusted every local user. Name the owners of a "
                "shared base store instead: FA4CACHE_TRUSTED_UIDS=<uid>[,<uid>...] (root is always trusted)"
            )
        values = {s.field: s.read(env) for s in SETTINGS if s.field}
        raw_dir = env.get(ENV_DIR) or ""
        values["cache_dir_from"] = ENV_DIR if values["cache_dir"] is not None else "default"
        if values["cache_dir"] is None:
            values["cache_dir"] = default_dir()
        if cache_dir is not None:
            raw_dir = path_text(cache_dir, setting=cache_dir_from)
            values["cache_dir"] = resolve_path(cache_dir, setting=cache_dir_from, node_id=_node_id())
            values["cache_dir_from"] = cache_dir_from
        values["node_local"] = (
            is_node_local_path(raw_dir)
            or bool(setting("FA4CACHE_NODE_LOCAL", env))
            or values["cache_dir"] == node_local_default()
        )
        by_field = {s.field: s for s in SETTINGS if s.field}
        for name, value in overrides.items():
            decl = by_field.get(name)
            if decl is None:
                raise ConfigError(f"unknown store option {name!r} (known: {', '.join(sorted(by_field))})")
            if name == "base_dirs" and not isinstance(value, str):
                if isinstance(value, os.PathLike):
                    value = (value,)
                value = tuple(
                    resolve_path(p, setting="base_dirs", node_id=_node_id(), what="base store") for p in value
                )
                _no_separator(value, setting="base_dirs")
            elif isinstance(value, str):
                value = decl.parse(value, setting=name)
            values[name] = value
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """Environment variables that reproduce these settings in another process."""
        env = {}
        for s in SETTINGS:
            if s.field is None:
                continue
            v = getattr(self, s.field)
            if v == s.default and s.field != "cache_dir":
                continue
            if isinstance(v, bool):
                text = "1" if v else "0"
            elif isinstance(v, tuple):
                if s.field == "base_dirs":
                    _no_separator(v, setting=s.name)
                text = (os.pathsep if s.field == "base_dirs" else ",").join(map(str, v))
            elif isinstance(v, float):
                text = repr(v)
            else:
                text = str(v)
            env[s.name] = text
        return env

    def job_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """:meth:`to_env` plus what every process of a job must share: FA4's and the CuTe
        DSL's own disk caches off (:data:`DSL_CACHES_OFF`) and the driver's value of every
        other job setting (they change which kernels a rank asks for)."""
        src = os.environ if environ is None else environ
        env = self.to_env()
        env.update(DSL_CACHES_OFF)
        for s in SETTINGS:
            if s.job and s.field is None and s.name in src:
                s.read(src)  # a bad value fails here, in the driver, not on every worker
                env[s.name] = src[s.name]
        return env
