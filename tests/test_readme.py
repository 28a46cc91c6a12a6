"""The README's commands and quick start lines as written (the manual in docs/ says the same).
The README's and the docs' snippets themselves run in tests/test_docs.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from fa4cache.arch import ARCH_VAR, DSL_ARCH_VAR, NUM_SMS_VAR
from fa4cache.store.paths import LAYOUT
from tests.conftest import ROOT


def _clean_env(cache_dir: Path) -> dict[str, str]:
    """This machine as a newcomer has it: no target arch named anywhere."""
    env = {k: v for k, v in os.environ.items() if k not in (ARCH_VAR, DSL_ARCH_VAR, NUM_SMS_VAR)}
    env["FA4CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = str(ROOT)
    return env


README = ROOT / "README.md"


DOCS = ROOT / "docs"


# The two commands, exactly: .ci/run runs the test command, install.sh the extras.
INSTALL_WARM_STATS = "bash scripts/install.sh && .venv/bin/fa4cache warm && .venv/bin/fa4cache stats"


TEST_COMMAND = ".venv/bin/python -m pytest -q -n 2 --dist loadgroup tests"


FAST_TIER = '.venv/bin/python -m pytest -q -m "not slow and not compile and not ray" tests'


def _snippet(path: Path, first_line: str) -> str:
    """The fenced block of ``path`` whose first line is ``first_line``."""
    blocks = path.read_text().split("```")[1::2]
    found = [b for b in blocks if b.split("\n", 1)[1:] and b.split("\n", 1)[1].startswith(first_line)]
    assert found, f"{path.name}: no snippet starting with {first_line!r}"
    return found[0]


def test_readme_and_docs_give_the_two_commands_ci_runs() -> None:
    for path in (README, DOCS / "index.md"):
        text = path.read_text()
        assert INSTALL_WARM_STATS in text and TEST_COMMAND in text and FAST_TIER in text, path
    # CI installs, runs exactly the test command, then the overlay legs (other releases) and ruff.
    ci = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")
    ]
    install = ci.index("bash scripts/install.sh")
    assert ci[install + 1] == TEST_COMMAND, ci
    assert all(line.startswith(("bash scripts/test_overlay.sh", " ")) for line in ci[install + 2 : -2]), ci
    assert ci[-2:] == [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."], ci
    assert '".[fa4,ray,transformers,test]"' in (ROOT / "scripts" / "install.sh").read_text()
    # Installed from a checkout or git, never a bare name from PyPI (it is not there).
    for path in (README, DOCS / "index.md"):
        assert not re.search(r"pip install (-U )?fa4cache\b(?!\[)", path.read_text()), path


def test_quick_start_and_transformers_lines_on_a_cpu_machine_without_a_target(tmp_path: Path) -> None:
    # The README's quick start and transformers lines (the same in docs/masks.md and
    # docs/transformers.md), in a fresh process on this CPU machine with no
    # FLASH_ATTENTION_ARCH: nothing raises, one warning names the variable, and no
    # toolchain is recorded (nothing can compile for no target).
    quick = _snippet(README, "# needs: GPU, your data loader")
    assert quick in (DOCS / "masks.md").read_text()
    for line in (
        "fa4cache.install()",
        "from flash_attn.cute import flash_attn_func",
        "mask = fa4cache.make_document_mask(batch.cu_seqlens, seqlen=q.shape[1])",
        "out = fa4cache.attention(q, k, v, mask)",
    ):
        assert line in quick, line
    assert "fa4cache.adapters.transformers.register()" in _snippet(README, "# needs: GPU, a model name")
    assert "fa4cache.adapters.transformers.register()" in (DOCS / "transformers.md").read_text()
    code = """
import sys
import fa4cache
assert "fa4cache.adapters" not in sys.modules
fa4cache.install()
from flash_attn.cute import flash_attn_func
import torch
mask = fa4cache.make_document_mask(torch.tensor([0, 212, 512]), seqlen=512)
q = torch.randn(1, 512, 2, 64, dtype=torch.bfloat16)
try:
    fa4cache.attention(q, q, q, mask)
except ValueError as e:
    print("ATTENTION", e)
fa4cache.adapters.transformers.register()
print("OK")
"""
    d = tmp_path / "cache"
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_clean_env(d),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("OK")
    assert "ATTENTION q: fa4cache.attention runs FA4's kernels, which need CUDA tensors" in p.stdout
    assert f"set {ARCH_VAR}=sm_90" in p.stderr and "no CUDA GPU is visible" in p.stderr
    assert not list((d / LAYOUT).glob("*/toolchain.json"))  # no empty toolchain recorded
