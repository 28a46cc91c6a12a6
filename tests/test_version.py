"""The version (fa4cache/version.py): the build from a checkout, the release elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_version_names_the_build_from_a_checkout_and_the_release_elsewhere(tmp_path: Path) -> None:
    import re
    import shutil

    import tomllib

    from fa4cache import version as v

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == v.RELEASE
    count, sha = _git("rev-list", "--count", "HEAD"), _git("rev-parse", "--short=7", "HEAD")
    want = rf"{re.escape(v.RELEASE)}\.dev{count}\+g{sha}(\.dirty)?"
    p = subprocess.run(
        [sys.executable, "-m", "fa4cache", "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert p.returncode == 0 and re.fullmatch(f"fa4cache {want}; flash-attn-4 .*", p.stdout.strip()), (
        p.stdout + p.stderr
    )
    # `import fa4cache` asks git nothing; the version is computed when first read.
    spy = (
        "import subprocess, sys\n"
        "calls = []\n"
        "real = subprocess.Popen.__init__\n"
        "def spy(self, *a, **k):\n    calls.append(a[0]); real(self, *a, **k)\n"
        "subprocess.Popen.__init__ = spy\n"
        "import fa4cache\n"
        "assert calls == [], calls\n"
        "print(fa4cache.__version__)\n"
    )
    p = subprocess.run([sys.executable, "-c", spy], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and re.fullmatch(want, p.stdout.strip()), p.stdout + p.stderr
    # Without git on PATH, and from a copy that is no checkout: the release.
    p = subprocess.run(
        [sys.executable, "-c", "import fa4cache; print(fa4cache.__version__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": str(tmp_path)},
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == v.RELEASE, p.stdout + p.stderr
    shutil.copytree(ROOT / "fa4cache", tmp_path / "site" / "fa4cache")
    p = subprocess.run(
        [sys.executable, "-c", "import fa4cache; print(fa4cache.__file__, fa4cache.__version__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.split() == [
        str(tmp_path / "site" / "fa4cache" / "__init__.py"),
        v.RELEASE,
    ], p.stdout + p.stderr
