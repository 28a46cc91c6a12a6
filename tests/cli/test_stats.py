"""``fa4cache stats`` (fa4cache/cli/store_commands.py): what it says about a store, a
read-only one, one not made yet and one of several toolchains.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fa4cache.store.paths import LAYOUT
from tests.conftest import run_cli
from tests.helpers.cli_stores import EMPTY, OLD
from tests.store.test_other_users import _seed, people  # noqa: F401  (a fixture: two real users)


def test_stats_zero_on_a_read_only_store_is_one_friendly_line(people: Any) -> None:  # noqa: F811
    # As a user other than root (root writes into a mode-500 directory).
    victim, _, _ = people
    mine = victim.home / "ro-store"
    _seed(victim, mine)
    for d in (mine / "stats", mine):
        os.chmod(d, 0o500)
    p = victim.cli(mine, "stats", "--zero")
    assert p.returncode == 2, p.stdout + p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and "Errno" not in line and "Traceback" not in line, line
    assert line.startswith("fa4cache stats: ") and "not writable by you" in line, line
    st = victim.cli(mine, "stats", "--json")  # reading the numbers still works
    assert st.returncode == 0 and json.loads(st.stdout)["entries"] == 1, st.stderr


def test_stats_on_a_path_with_no_store_says_so_as_ls_and_verify_do(tmp_path: Path) -> None:
    missing = tmp_path / "mistyped"
    outs = {cmd: run_cli(missing, cmd) for cmd in ("stats", "ls", "verify")}
    for cmd, p in outs.items():
        assert p.returncode == 2 and p.stdout == "", (cmd, p.stdout)
        assert p.stderr.startswith(f"fa4cache {cmd}: --cache-dir {missing} is not a store"), (cmd, p.stderr)
    assert "Hit rate" not in outs["stats"].stdout
    st = run_cli(missing, "stats", "--json")  # a script is told too: no zeros for a typo
    assert st.returncode == 2 and st.stdout == "" and "is not a store" in st.stderr
    z = run_cli(missing, "stats", "--zero")
    assert z.returncode == 2 and "is not a store" in z.stderr, z.stdout + z.stderr
    assert not missing.exists()


def test_one_toolchain_story_in_stats_ls_and_prune(two_toolchains: Path) -> None:
    st = json.loads(run_cli(two_toolchains, "stats", "--json").stdout)
    assert st["by_toolchain"][OLD]["current"]
    # The dry run says what would go and removes nothing (exit 0).
    dry = run_cli(two_toolchains, "prune", "--fingerprint", "stale", "--stale-after", "0s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove empty toolchain directory {EMPTY}" in dry.stdout
    assert "dry run: would remove 0 entries" in dry.stdout
    assert (two_toolchains / LAYOUT / EMPTY).is_dir()
    p = run_cli(two_toolchains, "prune", "--fingerprint", "stale", "--stale-after", "0s")
    assert p.returncode == 0, p.stderr
    assert "removed 0 entries" in p.stdout and "removed 1 empty toolchain directory" in p.stdout
    assert not (two_toolchains / LAYOUT / EMPTY).exists()
    assert len(list((two_toolchains / LAYOUT / OLD).glob("*/*.o"))) == 2  # the current one stays


@pytest.mark.parametrize(
    "command",
    [["stats"], ["ls"], ["verify"], ["prune", "--older-than", "1d"], ["clear", "--yes"]],
)
def test_commands_on_a_named_path_with_no_store_say_so_and_fail(tmp_path: Path, command: list[str]) -> None:
    p = run_cli(tmp_path / "not-yet", *command)
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert f"--cache-dir {tmp_path / 'not-yet'} is not a store: the directory does not exist" in p.stderr
    assert not (tmp_path / "not-yet").exists()
