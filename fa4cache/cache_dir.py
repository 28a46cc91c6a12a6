"""Where the store directory is, and in words what makes a path unusable as one.

Resolution: ``~`` and the ``{hostname}``, ``{user}``, ``{node_id}`` placeholders, the
default directory and the node-local default. Diagnosis: :func:`cache_dir_problem` (what is
wrong, that the user can fix), :func:`cache_dir_error` (the one error: what, which setting,
the fix) and :func:`check_cache_dir`, the one check of a store path given as input
(``install()``, ``fa4cache.env()``). :mod:`fa4cache.settings` parses the variables with these;
the store's own checks (:mod:`fa4cache.store.secure_io`, :mod:`fa4cache.store.root`) stay
the authority on what is opened.

This module imports nothing of the package but its errors: :mod:`fa4cache.settings`
imports it.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, Protocol

from .errors import ConfigError

ENV_DIR = "FA4CACHE_DIR"  # declared (parser, default, doc) in fa4cache.settings.SETTINGS
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
KNOWN_PLACEHOLDERS = ("hostname", "user", "node_id")


class NamedDir(Protocol):
    """What the diagnosis needs of :class:`fa4cache.settings.Settings`: the directory and
    where it was set (``FA4CACHE_DIR``, ``--cache-dir``, ``cache_dir``, ``default``)."""

    @property
    def cache_dir(self) -> Path: ...

    @property
    def cache_dir_from(self) -> str: ...


# --------------------------------------------------------------------------- resolution


def placeholder_values(node_id: str | None = None) -> dict[str, str]:
    """Values for ``{hostname}``, ``{user}``, ``{node_id}`` in this process. ``node_id``:
    ``FA4CACHE_NODE_ID`` as :mod:`fa4cache.settings` read it; else the Ray node id, else the
    hostname."""
    node = node_id or _ray_node_id() or socket.gethostname()
    return {"hostname": socket.gethostname(), "user": user_name(), "node_id": node}


def user_name() -> str:
    """This user's name for ``{user}``: ``$USER``/``$LOGNAME``, the passwd entry, else the uid
    (a container user without a passwd entry still gets a path of its own)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}" if hasattr(os, "getuid") else "user"


def _ray_node_id() -> str | None:
    # Only ask Ray if this process already imported it: importing Ray costs seconds.
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
    for name in PLACEHOLDER.findall(path):
        if name not in KNOWN_PLACEHOLDERS:
            raise ConfigError(
                f"{setting}: unknown placeholder {{{name}}} in {path!r} "
                f"(known: {', '.join('{' + p + '}' for p in KNOWN_PLACEHOLDERS)})"
            )


def path_text(path: Any, *, setting: str) -> str:
    """``os.fspath(path)``, or a :class:`ConfigError` naming ``setting`` (``install(123)``)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(
            f"{setting}: expected a directory path (str or os.PathLike), got {type(path).__name__} {path!r}"
        )
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ConfigError(f"{setting}: expected a str path, got {type(text).__name__} {text!r}")
    return text


def resolve_path(
    path: str | os.PathLike[str], *, setting: str, node_id: str | None = None, what: str = "cache directory"
) -> Path:
    """Expand ``~`` and placeholders; require an absolute result. ``what``: the directory's
    role, for the error (``cache directory``, ``base store``)."""
    raw = path_text(path, setting=setting)
    text = os.path.expanduser(raw)
    check_placeholders(text, setting=setting)
    if PLACEHOLDER.search(text):
        values = placeholder_values(node_id)
        text = PLACEHOLDER.sub(lambda m: _safe_component(values[m.group(1)]), text)
    p = Path(text)
    if not p.is_absolute():
        raise ConfigError(f"{setting}: {what} must be an absolute path, got {raw!r}")
    return p


def _safe_component(value: str) -> str:
    # A hostname or node id becomes one path component: never a separator or '..'.
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", value)
    return cleaned if cleaned not in ("", ".", "..") else "_"


# The Ray hook's default on each node: fast local disk, shared by the ranks of a node.
NODE_LOCAL_DEFAULT = "/var/tmp/fa4cache-{user}"


def node_local_default() -> Path:
    return resolve_path(NODE_LOCAL_DEFAULT, setting="node-local default")


def is_node_local_path(raw: str | os.PathLike[str]) -> bool:
    """Whether a store path as written names a per-node directory: one with a placeholder."""
    return PLACEHOLDER.search(os.fspath(raw)) is not None


def default_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "fa4cache"


# --------------------------------------------------------------------------- the directory


def cache_dir_problem(path: Path, *, write: bool = True) -> str | None:
    """What makes ``path`` unusable as a store directory, in words, or None (also when it
    does not exist yet: it is created at first use). ``write=False``: for reading only (a
    read-only store can still be looked at). Only what the user can fix is named; the
    store's own checks (:mod:`fa4cache.store.secure_io`) stay the authority."""
    import stat

    probe = path
    while True:  # the deepest component that exists
        try:
            st = os.lstat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):  # not there yet, or a file above it
            if probe == probe.parent:
                return None
            probe = probe.parent
        except OSError as e:
            return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode) and probe == path:
        real = os.path.realpath(path)
        return (
            f"is a symlink to {real}, and a symlink can be redirected by whoever owns it: name {real} itself"
        )
    try:
        is_dir = stat.S_ISDIR(os.stat(probe).st_mode)
    except OSError as e:  # a dangling link on the way
        return f"cannot be reached ({probe}: {e.strerror})"
    if not is_dir:
        return "is a file, not a directory" if probe == path else f"is under {probe}, which is a file"
    if not write:  # looking only: another owner's (trusted) store can be read
        return None
    if probe == path and hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by you"
    if probe == path and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); chmod 700 it"
    if not os.access(probe, os.W_OK | os.X_OK):
        return (
            "is not writable by you"
            if probe == path
            else f"cannot be created: {probe} is not writable by you"
        )
    return None


def describe_cache_dir(settings: NamedDir) -> str:
    """``FA4CACHE_DIR=/x``, ``--cache-dir /x`` or ``the default directory /x``."""
    src, path = settings.cache_dir_from, settings.cache_dir
    if src == ENV_DIR or src == "cache_dir":
        return f"{src}={path}"
    if src.startswith("--"):
        return f"{src} {path}"
    return f"the default directory {path}"


def cache_dir_fix(settings: NamedDir) -> str:
    """How to point fa4cache at another directory, naming the setting in use."""
    src = settings.cache_dir_from
    if src == "default":
        return f"set {ENV_DIR} to a directory you own (e.g. {ENV_DIR}=$HOME/fa4cache)"
    other = f"; or unset {ENV_DIR} to use {default_dir()}" if src == ENV_DIR else ""
    return f"point {src} at a directory you own (mode 700), or at a path that does not exist yet{other}"


def cache_dir_error(settings: NamedDir, problem: str) -> ConfigError:
    """The one error for an unusable store directory: what, where it was set, the fix."""
    return ConfigError(f"{describe_cache_dir(settings)} {problem}; {cache_dir_fix(settings)}")


def check_cache_dir(settings: NamedDir, *, write: bool = False, note: str = "") -> None:
    """Raise :func:`cache_dir_error` where ``settings.cache_dir``, given as input, is a
    mistake: a path that can never be a store directory (a file in the way, one that cannot
    be read); with ``write=True`` also one this user cannot create or write. A symlink is
    left to the store's own policy at ``write=False`` (a node-local path falls back to the
    private default; any other is refused when the store opens it). ``note``: said after
    the problem (how the path was resolved)."""
    problem = cache_dir_problem(settings.cache_dir, write=write)
    if problem is not None and (write or "symlink" not in problem):
        raise cache_dir_error(settings, f"{problem}{note}")
