"""On the GPU: a process's own forward, compiled without the DSL's JIT engine, runs from the
bytes it published and gives what the DSL's own compile gives, bit for bit (its output; the
gradients as close as two runs of one backward are).

Run on an H200: ``pytest -m gpu`` (benchmarks/gpu_run.sh, on each FA4 release). Skipped
without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu


def _run(store: Path, out: Path, **env: str) -> dict[str, Any]:
    # From another folder, the source tree last on the path: the installed fa4cache (with its
    # adapters) is the one imported, this tree only for tests.helpers.
    path = os.pathsep.join(x for x in (os.environ.get("PYTHONPATH"), str(ROOT)) if x)
    p = subprocess.run(
        [sys.executable, "-m", "tests.helpers.gpu_forward", str(out)],
        cwd=tempfile.gettempdir(),
        env={**os.environ, "PYTHONPATH": path, "FA4CACHE_DIR": str(store), "FA4CACHE_COMPILE_AHEAD": "0", **env},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_the_engine_less_forward_gives_the_dsls_own_results(tmp_path: Path) -> None:
    import torch

    own = _run(tmp_path / "own", tmp_path / "own.pt", FA4CACHE_EXPORT_ONLY="0")
    fast = _run(tmp_path / "fast", tmp_path / "fast.pt")
    warm = _run(tmp_path / "fast", tmp_path / "warm.pt")  # a second process on the same store
    assert own["published_run"] == [] and own["compiles"] >= 4, own
    assert fast["published_run"] == ["fwd"] and fast["compiles"] == own["compiles"], fast
    assert warm["compiles"] == 0 and warm["published_run"] == [], warm
    ref = torch.load(tmp_path / "own.pt")
    for name, path in (("engine-less", "fast.pt"), ("warm", "warm.pt")):
        got = torch.load(tmp_path / path)
        # The forward (the kernel at stake) bit for bit; the gradients as close as two runs of
        # one backward are (its dq accumulates in any order).
        assert torch.equal(got[0], ref[0]), f"{name}: the output differs from the DSL's own compile"
        for what, a, b in zip(("dq", "dk", "dv"), got[1:], ref[1:]):
            assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-2), f"{name}: {what}"
