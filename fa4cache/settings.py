"""Settings: where the store lives and how it behaves, from arguments or the environment.

All knobs are environment variables so that they cross process boundaries (torchrun
ranks, Ray workers, subprocess compile pools) without code changes:

=============================  =====================================================
``FA4CACHE_DIR``               store directory (default ``$XDG_CACHE_HOME/fa4cache``,
                               else ``~/.cache/fa4cache``); may hold ``{hostname}``,
                               ``{user}``, ``{node_id}`` placeholders
``FA4CACHE_BASE_DIRS``         read-only base stores tried after the local one
                               (``os.pathsep``-separated), e.g. a pre-warmed image
``FA4CACHE_LOCK_TIMEOUT``      seconds to wait for another process compiling the same
                               kernel before compiling anyway (default 600)
``FA4CACHE_MAX_SIZE``          size cap such as ``20G``; enforced opportunistically
``FA4CACHE_TRUST_SHARED``      ``1``: load from directories/entries owned by other
                               users (a shared, read-only team cache). Default ``0``
``FA4CACHE_INSECURE``          ``refuse`` (default) or ``warn``: what to do with an
                               entry that fails the ownership/permission checks
``FA4CACHE_DISABLE``           ``1``: install() becomes a no-op (escape hatch)
=============================  =====================================================
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import ConfigError

ENV_DIR = "FA4CACHE_DIR"
ENV_BASE_DIRS = "FA4CACHE_BASE_DIRS"
ENV_LOCK_TIMEOUT = "FA4CACHE_LOCK_TIMEOUT"
ENV_MAX_SIZE = "FA4CACHE_MAX_SIZE"
ENV_TRUST_SHARED = "FA4CACHE_TRUST_SHARED"
ENV_INSECURE = "FA4CACHE_INSECURE"
ENV_DISABLE = "FA4CACHE_DISABLE"
ENV_NODE_ID = "FA4CACHE_NODE_ID"
# Not store settings, but choices that change which kernels a job asks for; forwarded
# from the driver to Ray workers so that every rank asks for the same ones.
ENV_INTERVAL_MASKING = "FA4CACHE_INTERVAL_MASKING"
ENV_TRITON = "FA4CACHE_TRITON"
MASK_ENV_VARS = (ENV_INTERVAL_MASKING, ENV_TRITON)

ALL_ENV_VARS = (
    ENV_DIR,
    ENV_BASE_DIRS,
    ENV_LOCK_TIMEOUT,
    ENV_MAX_SIZE,
    ENV_TRUST_SHARED,
    ENV_INSECURE,
    ENV_DISABLE,
)

DEFAULT_LOCK_TIMEOUT = 600.0
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
KNOWN_PLACEHOLDERS = ("hostname", "user", "node_id")

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, *, setting: str = "size") -> int:
    """Parse ``"2G"``, ``"500M"``, ``"1.5T"`` or a plain byte count into bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ConfigError(f"{setting}: cannot parse size {text!r} (use e.g. 500M, 2G, 1T)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_duration(text: str, *, setting: str = "duration") -> float:
    """Parse ``"30d"``, ``"12h"``, ``"15m"``, ``"45s"`` or plain seconds into seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*", str(text))
    if not m:
        raise ConfigError(f"{setting}: cannot parse duration {text!r} (use e.g. 45s, 15m, 12h, 30d)")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]
    return float(m.group(1)) * scale


def _flag(name: str, value: str | None) -> bool:
    if value is None or value == "":
        return False
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected 0/1, got {value!r}")


def placeholder_values(node_id: str | None = None) -> dict[str, str]:
    """Values for ``{hostname}``, ``{user}``, ``{node_id}`` in this process."""
    node = node_id or os.environ.get(ENV_NODE_ID) or _ray_node_id() or socket.gethostname()
    return {"hostname": socket.gethostname(), "user": getpass.getuser(), "node_id": node}


def _ray_node_id() -> str | None:
    # Only ask Ray if this process already imported it: importing Ray costs seconds.
    import sys

    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # Ray not connected yet: fall back to the hostname
        return None
    return None


def check_placeholders(path: str, *, setting: str) -> None:
    for name in _PLACEHOLDER.findall(path):
        if name not in KNOWN_PLACEHOLDERS:
            raise ConfigError(
                f"{setting}: unknown placeholder {{{name}}} in {path!r} "
                f"(known: {', '.join('{' + p + '}' for p in KNOWN_PLACEHOLDERS)})"
            )


def resolve_path(path: str | os.PathLike[str], *, setting: str, node_id: str | None = None) -> Path:
    """Expand ``~`` and placeholders; require an absolute result."""
    text = os.path.expanduser(os.fspath(path))
    check_placeholders(text, setting=setting)
    if _PLACEHOLDER.search(text):
        values = placeholder_values(node_id)
        text = _PLACEHOLDER.sub(lambda m: _safe_component(values[m.group(1)]), text)
    p = Path(text)
    if not p.is_absolute():
        raise ConfigError(f"{setting}: cache directory must be an absolute path, got {os.fspath(path)!r}")
    return p


def _safe_component(value: str) -> str:
    # A hostname or node id becomes one path component: never a separator or '..'.
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", value)
    return cleaned if cleaned not in ("", ".", "..") else "_"


def default_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "fa4cache"


@dataclass(frozen=True)
class Settings:
    """Resolved store settings. Build with :meth:`from_env` or :func:`dataclasses.replace`."""

    cache_dir: Path
    base_dirs: tuple[Path, ...] = ()
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    max_size: int | None = None
    trust_shared: bool = False
    insecure_policy: str = "refuse"
    disabled: bool = False
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_env(cls, cache_dir: str | os.PathLike[str] | None = None, **overrides: object) -> Settings:
        env = os.environ
        raw_dir = cache_dir if cache_dir is not None else env.get(ENV_DIR)
        setting = "cache_dir" if cache_dir is not None else ENV_DIR
        path = resolve_path(raw_dir, setting=setting) if raw_dir else default_dir()
        bases = tuple(
            resolve_path(p, setting=ENV_BASE_DIRS) for p in env.get(ENV_BASE_DIRS, "").split(os.pathsep) if p
        )
        try:
            timeout = float(env.get(ENV_LOCK_TIMEOUT, DEFAULT_LOCK_TIMEOUT))
        except ValueError:
            raise ConfigError(
                f"{ENV_LOCK_TIMEOUT}: expected seconds, got {env[ENV_LOCK_TIMEOUT]!r}"
            ) from None
        if timeout < 0:
            raise ConfigError(f"{ENV_LOCK_TIMEOUT}: must be >= 0, got {timeout}")
        max_size = parse_size(env[ENV_MAX_SIZE], setting=ENV_MAX_SIZE) if env.get(ENV_MAX_SIZE) else None
        policy = env.get(ENV_INSECURE, "refuse").strip().lower()
        if policy not in ("refuse", "warn"):
            raise ConfigError(f"{ENV_INSECURE}: expected 'refuse' or 'warn', got {policy!r}")
        s = cls(
            cache_dir=path,
            base_dirs=bases,
            lock_timeout=timeout,
            max_size=max_size,
            trust_shared=_flag(ENV_TRUST_SHARED, env.get(ENV_TRUST_SHARED)),
            insecure_policy=policy,
            disabled=_flag(ENV_DISABLE, env.get(ENV_DISABLE)),
        )
        if overrides:
            known = {f for f in cls.__dataclass_fields__}
            unknown = set(overrides) - known
            if unknown:
                raise ConfigError(f"unknown store option(s): {', '.join(sorted(unknown))}")
            if "base_dirs" in overrides:
                overrides["base_dirs"] = tuple(
                    resolve_path(p, setting="base_dirs")
                    for p in overrides["base_dirs"]  # type: ignore[union-attr]
                )
            if isinstance(overrides.get("max_size"), str):
                overrides["max_size"] = parse_size(overrides["max_size"], setting="max_size")  # type: ignore[arg-type]
            s = replace(s, **overrides)  # type: ignore[arg-type]
        return s

    def job_env(self) -> dict[str, str]:
        """:meth:`to_env` plus what every process of a job must share: FA4's own disk
        cache off (it would store every kernel a second time) and the driver's mask-code
        choices (:data:`MASK_ENV_VARS`), which change the kernels a rank asks for."""
        env = self.to_env()
        env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "0"
        env.update({k: os.environ[k] for k in MASK_ENV_VARS if k in os.environ})
        return env

    def to_env(self) -> dict[str, str]:
        """Environment variables that reproduce these settings in another process."""
        env = {ENV_DIR: str(self.cache_dir), ENV_LOCK_TIMEOUT: repr(self.lock_timeout)}
        if self.base_dirs:
            env[ENV_BASE_DIRS] = os.pathsep.join(map(str, self.base_dirs))
        if self.max_size is not None:
            env[ENV_MAX_SIZE] = str(self.max_size)
        if self.trust_shared:
            env[ENV_TRUST_SHARED] = "1"
        if self.insecure_policy != "refuse":
            env[ENV_INSECURE] = self.insecure_policy
        return env
