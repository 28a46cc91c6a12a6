"""A newcomer's first day (issue 52): no command destroys what a user did not mean, the
CLI says true things about the store, and the package is ready to be adopted.

Fast: the CLI runs in subprocesses (or through ``fa4cache.cli.main``) on stores written
through the real Store API (no compile); a terminal is a real pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fa4cache.settings import parse_duration, parse_size
from fa4cache.store.paths import LAYOUT, EntryRef
from fa4cache.store.store import Store
from tests.conftest import ROOT, run_cli, worker_env
from tests.store.test_security import _seed, people  # noqa: F401  (a fixture: two real users)

TC = "0123456789abcdef0123"
DAY = 86400.0


def _publish(store: Store, kind: str, n: int, size: int, used_ago: float) -> EntryRef:
    ref = EntryRef(TC, kind, f"{n:064x}")
    summary = {"dtype": "bf16", "head_dim": 128, "mask": "b2f70b3b0552"}
    assert store.publish_bytes(ref, b"\x7fELF" + bytes(size), summary=summary, compile_seconds=8.5)
    use = store.layout.use_path(ref)
    rec = json.loads(use.read_text()) if use.exists() else {"hits": 0}
    rec["last_used"] = time.time() - used_ago
    use.write_text(json.dumps(rec))
    return ref


@pytest.fixture
def four_kernels(tmp_path: Path) -> Path:
    """A store of four kernels: three used 2 days ago (small), one used now (large)."""
    root = tmp_path / "cache"
    store = Store.at(root)
    store.record_toolchain(TC, {"id": TC})
    _publish(store, "fwd", 1, 1000, 2 * DAY)
    _publish(store, "bwd", 2, 2000, 2 * DAY)
    _publish(store, "bwd_preprocess", 3, 500, 2 * DAY)
    _publish(store, "bwd_postprocess_convert", 4, 20_000, 10)
    return root


def _objects(root: Path) -> set[str]:
    return {p.stem for p in (root / LAYOUT).glob("*/*/*.o")}


def _on_terminal(root: Path, *args: str, answer: str) -> subprocess.CompletedProcess[str]:
    """The CLI with a real terminal as its stdin, on which ``answer`` is typed."""
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(
            [sys.executable, "-m", "fa4cache", "--cache-dir", str(root), *args],
            cwd=ROOT,
            env=worker_env(root),
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(slave)
        os.write(master, answer.encode())
        out, err = p.communicate(timeout=120)
    finally:
        os.close(master)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


# ---------------------------------------------------------------- 1: destructive commands


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["--older-than", "30"], "--older-than 30d"),
        (["--max-size", "2"], "--max-size 2G"),
        (["--max-size", "0"], "--max-size 0G"),
        (["--fingerprint", "stale", "--stale-after", "5"], "--stale-after 5d"),
    ],
)
def test_prune_refuses_a_bare_number_naming_the_argument_and_the_fix(
    four_kernels: Path, args: list[str], fix: str
) -> None:
    before = _objects(four_kernels)
    for extra in ([], ["--yes"], ["--dry-run"]):
        p = run_cli(four_kernels, "prune", *args, *extra)
        assert p.returncode == 2, (args, extra, p.stdout, p.stderr)
        line = p.stderr.strip()
        assert len(line.splitlines()) == 1 and "no unit" in line and fix in line, line
        assert line.startswith(f"fa4cache prune: {args[-2]}: "), line
    assert _objects(four_kernels) == before


def test_sizes_and_ages_with_units_parse() -> None:
    ages = {"30d": 30 * DAY, "12h": 12 * 3600, "90m": 90 * 60, "45s": 45, "2w": 14 * DAY}
    for text, seconds in ages.items():
        assert parse_duration(text, setting="--older-than") == seconds
    sizes = {"2G": 2 << 30, "500M": 500 << 20, "1024K": 1 << 20, "10B": 10, "1GiB": 1 << 30, "3kb": 3 << 10}
    for text, n in sizes.items():
        assert parse_size(text, setting="--max-size", unit_required=True) == n
    # A setting in the environment keeps its plain byte count (FA4CACHE_MAX_SIZE=1000000).
    assert parse_size("1000000", setting="FA4CACHE_MAX_SIZE") == 1000000


def test_prune_of_most_of_the_store_asks_on_a_terminal_and_refuses_without(four_kernels: Path) -> None:
    before = _objects(four_kernels)
    # 3 of 4 entries: refused without a terminal, naming --yes; nothing removed.
    p = run_cli(four_kernels, "prune", "--older-than", "1d")
    assert p.returncode == 2 and "--yes" in p.stderr and "3 entries" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert _objects(four_kernels) == before
    # On a terminal: asked; "n" keeps everything (exit 1), "y" removes the three.
    p = _on_terminal(four_kernels, "prune", "--older-than", "1d", answer="n\n")
    assert p.returncode == 1 and "Remove 3 entries" in p.stdout and "[y/N]" in p.stdout, p.stdout + p.stderr
    assert "nothing removed" in p.stdout and _objects(four_kernels) == before
    p = _on_terminal(four_kernels, "prune", "--older-than", "1d", answer="y\n")
    assert p.returncode == 0 and "removed 3 entries" in p.stdout, p.stdout + p.stderr
    assert len(_objects(four_kernels)) == 1


def test_prune_of_most_of_the_bytes_needs_yes(four_kernels: Path) -> None:
    # One entry of four, but most of the bytes (the large one, last used 5 days ago): asked too.
    (big,) = (four_kernels / LAYOUT).glob("*/bwd_postprocess_convert/*.use")
    big.write_text(json.dumps({**json.loads(big.read_text()), "last_used": time.time() - 5 * DAY}))
    p = run_cli(four_kernels, "prune", "--older-than", "4d")
    assert p.returncode == 2 and "--yes" in p.stderr and "remove 1 entry" in p.stderr, p.stderr
    assert len(_objects(four_kernels)) == 4
    p = run_cli(four_kernels, "prune", "--older-than", "4d", "--yes")
    assert p.returncode == 0 and "removed 1 entry" in p.stdout, p.stdout + p.stderr
    assert len(_objects(four_kernels)) == 3


def test_prune_of_a_small_part_runs_without_asking(four_kernels: Path) -> None:
    # The store is 23.0 KiB: fitting it into 22K removes the least recently used small entry.
    p = run_cli(four_kernels, "prune", "--max-size", "22K")
    assert p.returncode == 0 and "removed 1 entry" in p.stdout, p.stdout + p.stderr
    assert "Remove" not in p.stdout and len(_objects(four_kernels)) == 3


@pytest.mark.parametrize("args", [["--older-than", "1d"], ["--max-size", "21K"], ["--max-size", "0B"]])
def test_prune_dry_run_lists_exactly_what_the_run_removes(four_kernels: Path, args: list[str]) -> None:
    dry = run_cli(four_kernels, "prune", *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    listed = {ln.split()[3] for ln in dry.stdout.splitlines() if ln.startswith("would remove ")}
    assert listed, dry.stdout
    before = _objects(four_kernels)
    assert _objects(four_kernels) == before  # the dry run removed nothing
    real = run_cli(four_kernels, "prune", *args, "--yes")
    assert real.returncode == 0, real.stdout + real.stderr
    gone = before - _objects(four_kernels)
    assert {d[:16] for d in gone} == listed
    n = len(gone)
    assert f"would remove {n} entr" in dry.stdout and f"removed {n} entr" in real.stdout


def test_clear_refuses_without_a_terminal_and_asks_on_one(four_kernels: Path) -> None:
    p = run_cli(four_kernels, "clear")
    assert p.returncode == 2 and "--yes" in p.stderr and len(_objects(four_kernels)) == 4
    p = _on_terminal(four_kernels, "clear", answer="no\n")
    assert p.returncode == 1 and "[y/N]" in p.stdout and len(_objects(four_kernels)) == 4
    p = _on_terminal(four_kernels, "clear", answer="y\n")
    assert p.returncode == 0 and "removed 4 entries" in p.stdout and not _objects(four_kernels)


# ---------------------------------------------------------------- 11, 12: stats tells the truth

def test_stats_zero_on_a_read_only_store_is_one_friendly_line(people: Any) -> None:
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
        assert p.returncode == 0 and p.stderr == "", (cmd, p.stderr)
        assert p.stdout.startswith(f"no store at {missing} yet: 0 entries"), (cmd, p.stdout)
    assert "Hit rate" not in outs["stats"].stdout
    st = run_cli(missing, "stats", "--json")  # a script still gets its numbers: zeros
    assert st.returncode == 0 and json.loads(st.stdout)["entries"] == 0
    z = run_cli(missing, "stats", "--zero")
    assert z.returncode == 0 and "no store at" in z.stdout, z.stdout + z.stderr
    assert not missing.exists()
