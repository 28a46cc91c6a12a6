"""A base install (fa4cache/extras.py): a feature whose extra is missing names the pip line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

_NO_TORCH = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "flash_attn", "cutlass", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
"""


def test_a_mask_in_a_base_install_names_the_extra(tmp_path: Path) -> None:
    code = _NO_TORCH + (
        "import fa4cache\n"
        "try:\n    fa4cache.make_document_mask([0, 3, 8])\n"
        "except fa4cache.FA4NotAvailable as e:\n    print('MASK', e)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.startswith("MASK ") and "pip install 'fa4cache[fa4]'" in p.stdout, p.stdout


def test_transformers_extra_alone_names_the_fa4_extra(tmp_path: Path) -> None:
    # pyproject: the [transformers] extra brings [fa4]; without its packages the adapter and
    # warm say which extra to install (as a pip install line), not "No module named 'torch'".
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "fa4cache[fa4]" in extras["transformers"]
    code = _NO_TORCH + (
        "import fa4cache\n"
        "try:\n    fa4cache.adapters.transformers.register()\nexcept fa4cache.FA4NotAvailable as e:\n"
        "    print('REGISTER', e)\n"
        "from fa4cache.cli import main\nsys.exit(main(['--cache-dir', sys.argv[1], 'warm']))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "REGISTER" in p.stdout and "pip install 'fa4cache[fa4]'" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 2 and "fa4cache warm: compiling kernels needs torch" in p.stderr
    assert "pip install 'fa4cache[fa4]'" in p.stderr and "Traceback" not in p.stderr
