"""``fa4cache prune`` and ``fa4cache clear`` (fa4cache/cli/store_commands.py): no command
destroys what a user did not mean; a run says what it removes.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fa4cache.store.paths import LAYOUT, EntryRef
from fa4cache.store.store import Store
from tests.conftest import ROOT, run_cli, worker_env
from tests.helpers.cli_stores import DAY, OLD


def _publish(store: Store, kind: str, n: int, size: int, used_ago: float) -> EntryRef:
    ref = EntryRef(OLD, kind, f"{n:064x}")
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
    store.record_toolchain(OLD, {"id": OLD})
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


def test_prune_and_clear_json_say_what_the_run_removes(four_kernels: Path, tmp_path: Path) -> None:
    dry = run_cli(four_kernels, "prune", "--older-than", "1d", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True and len(plan["removed"]) == 3 and plan["remaining"] == 1
    assert _objects(four_kernels) == {f"{n:064x}" for n in (1, 2, 3, 4)}
    real = json.loads(run_cli(four_kernels, "prune", "--older-than", "1d", "--yes", "--json").stdout)
    assert real["dry_run"] is False and real["skipped"] == real["failed"] == []
    assert sorted(r["digest"] for r in real["removed"]) == sorted(r["digest"] for r in plan["removed"])
    assert real["removed_bytes"] == plan["removed_bytes"] and real["remaining"] == 1
    c = json.loads(run_cli(four_kernels, "clear", "--dry-run", "--json").stdout)
    assert [r["kind"] for r in c["removed"]] == ["bwd_postprocess_convert"] and c["remaining"] == 0
    gone = run_cli(tmp_path / "none", "prune", "--max-size", "1G", "--json")
    assert gone.returncode == 2 and gone.stdout == "" and "is not a store" in gone.stderr
