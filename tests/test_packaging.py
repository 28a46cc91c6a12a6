"""The package as shipped: the license and ``py.typed`` in the tree and in the wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_the_license_file_and_py_typed_are_in_the_tree() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "the fa4cache authors" in text
    assert (ROOT / "fa4cache" / "py.typed").is_file()


@pytest.mark.slow
def test_the_wheel_carries_the_license_and_py_typed(tmp_path: Path) -> None:
    # The wheel itself, built as pyproject.toml says (about a minute on a busy 2-core machine).
    import zipfile

    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; pyproject.toml's build needs >= 77")
    import shutil

    # From a copy: pip builds in the source tree (build/, *.egg-info), and the checkout stays as it is.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "site")
    shutil.copytree(ROOT, src, ignore=skip)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w",
         str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (wheel,) = tmp_path.glob("fa4cache-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fa4cache/py.typed" in names
    (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: BSD-3-Clause" in meta and "License-File: LICENSE" in meta
    assert zipfile.ZipFile(wheel).read(lic).decode() == (ROOT / "LICENSE").read_text()
