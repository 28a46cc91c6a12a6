"""Why a miss missed (fa4cache/store/nearmiss.py): news in a job, not during warm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, worker_env

_MISS = """
import sys
from fa4cache.store import Store, counters, nearmiss
from tests.helpers.fake_compiler import FakeFA4

store = Store(cache_dir=sys.argv[1])
fa = FakeFA4(store, "fwd")
fa.call(7, 0)
nearmiss._seen_kinds.clear()  # as in a fresh process: its first miss of the kind
if sys.argv[2] == "warm":
    counters.mark_warm_process()
fa.call(8, 0)
print("compiles", fa.compiles)
"""


@pytest.mark.parametrize("who", ["job", "warm"])
def test_a_miss_is_news_in_a_job_and_not_in_warm(tmp_path: Path, who: str) -> None:
    p = subprocess.run(
        [sys.executable, "-c", _MISS, str(tmp_path / who), who],
        cwd=ROOT, env=worker_env(tmp_path / who), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == "compiles 2", p.stdout + p.stderr
    said = "fwd miss: the closest key in this store differs in key" in p.stderr
    assert said == (who == "job"), p.stderr
