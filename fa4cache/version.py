"""The package version, in the lowest layer so that any module can record it.

:data:`RELEASE` is the release this code is (``pyproject.toml``'s version). Run from a git
checkout, ``__version__`` names the build the way setuptools-scm does for an untagged
repository: ``0.1.0.dev<commits>+g<sha>``, with ``.dirty`` when tracked files differ from
that commit. From an installed wheel, or where git is missing or fails, it is the release.
It is computed on first use (``fa4cache --version``, the origin of a published entry, a
bundle's producer), never by ``import fa4cache``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

RELEASE = "0.1.0"


def _git(root: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(
            ["git", "-c", f"safe.directory={root}", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=5,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # a version query never takes git's index lock
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


@functools.cache
def version() -> str:
    """``RELEASE``, or ``RELEASE.devN+g<sha>[.dirty]`` in a git checkout of this repository."""
    root = Path(__file__).resolve().parent.parent
    # Only this repository's own checkout: never a repository that merely contains an install.
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return RELEASE
    described = _git(root, "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*")
    count = _git(root, "rev-list", "--count", "HEAD")
    if not described or not count or not count.isdigit():
        return RELEASE
    sha, dirty = described.removesuffix("-dirty"), described.endswith("-dirty")
    return f"{RELEASE}.dev{count}+g{sha}{'.dirty' if dirty else ''}"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
