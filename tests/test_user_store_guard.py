"""The suite never writes the user's store (tests/helpers/user_store_guard.py): a test that
names no store writes the run's own, and one that reaches the user's fails. Each case runs a
real pytest on a small test file with this suite's conftest, the user's store and home in
tmp directories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.helpers import user_store_guard

CHILD = """
import pytest

from fa4cache.store.store import Store

TC = "0123456789abcdef0123"


def test_names_no_store():
    # As a test that installs fa4cache without a store of its own (fht.register(), install()).
    Store().record_toolchain(TC, {"id": TC})


def test_reaches_the_default_store(monkeypatch):
    monkeypatch.delenv("FA4CACHE_DIR")
    Store().record_toolchain(TC, {"id": TC})
"""


def test_a_test_that_names_no_store_never_writes_the_users(tmp_path: Path) -> None:
    user_store, cache_home = tmp_path / "user-store", tmp_path / "xdg"
    cache_home.mkdir()
    (tmp_path / "test_child.py").write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k not in (user_store_guard.ENV, "PYTEST_XDIST_WORKER")}
    env.update(FA4CACHE_DIR=str(user_store), XDG_CACHE_HOME=str(cache_home), PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path / "test_child.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = p.stdout + p.stderr
    # The user's FA4CACHE_DIR: the test that named no store wrote the run's own instead.
    assert not user_store.exists(), out
    # The default store: refused, and the test that tried fails, naming it.
    assert not (cache_home / "fa4cache").exists(), out
    assert p.returncode == 1 and "2 passed, 1 error" in out, out
    assert "ERROR at teardown of test_reaches_the_default_store" in out, out
    assert (
        "this test tried to write the user's store" in out and f"os.mkdir {cache_home / 'fa4cache'}" in out
    ), out
