"""What a fresh-clone newcomer walk found in the CLI (benchmarks/results/newcomer_walkthrough.md):
the real CLI in a subprocess, on real stores in tmp directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, run_cli, worker_env

# ---------------------------------------------------------------- ls and stats count the same loads

_LOAD = """
import sys
from fa4cache.store import Store, counters
from tests.helpers.fake_compiler import FakeFA4

if sys.argv[2] == "warm":
    counters.mark_warm_process()
fa = FakeFA4(Store(cache_dir=sys.argv[1]), "fwd")
fa.call(7, 0)
print("compiles", fa.compiles)
"""


def _load(store: Path, who: str) -> int:
    p = subprocess.run(
        [sys.executable, "-c", _LOAD, str(store), who],
        cwd=ROOT, env=worker_env(store), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.startswith("compiles "), p.stdout + p.stderr
    return int(p.stdout.split()[1])


def test_ls_and_stats_count_the_same_loads_and_a_warm_lookup_is_neither(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    assert _load(d, "job") == 1  # compiled and stored
    assert _load(d, "job") == 0  # a job's disk hit
    (before,) = json.loads(run_cli(d, "ls", "--json").stdout)
    assert _load(d, "warm") == 0  # warm checking the kernel is there: a lookup, not a hit
    (row,) = json.loads(run_cli(d, "ls", "--json").stdout)
    st = json.loads(run_cli(d, "stats", "--json").stdout)
    assert row["hits"] == st["disk_hits"] == st["by_kind"]["fwd"]["disk_hits"] == 1, (row, st)
    assert row["last_used"] > before["last_used"]  # warm still renews the entry for prune
    ls = run_cli(d, "ls").stdout.splitlines()
    assert ls[0].split()[-2:] == ["disk", "hits"] and ls[1].split()[-1] == "1", ls
