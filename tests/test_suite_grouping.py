"""The suite's parallel run keeps its groups (``--dist loadgroup``): the Ray tests share one
cluster at a time, and tests that share a warmed store run where it was warmed. pytest 9.2
broke that silently (pytest-dev/pytest-xdist#1386: every test distributed as if unmarked);
this runs pytest-xdist on a small file of its own and checks that a group stays on one worker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

CASES = """
import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def test_a_marked_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this repository's settings
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v",
         "test_cases.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    workers = re.findall(r"\[(gw\d+)\] .*PASSED test_cases.py::test_grouped", p.stdout)
    assert len(workers) == 6, p.stdout[-3000:]
    assert len(set(workers)) == 1, (
        f"the group ran on {sorted(set(workers))}: this pytest/pytest-xdist pair does not keep "
        "xdist_group together (see pyproject.toml's pin)"
    )
