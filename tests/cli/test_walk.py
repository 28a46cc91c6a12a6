"""What a fresh-clone newcomer walk found in the CLI (benchmarks/results/newcomer_walkthrough.md):
the real CLI in a subprocess, on real stores in tmp directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, run_cli, worker_env
from tests.helpers.cli_stores import cli

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


# ---------------------------------------------------------------- a mistyped store path is said, never made


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI with the store named only by ``args`` and ``env`` (no FA4CACHE_DIR otherwise)."""
    full = {k: v for k, v in worker_env(Path("/unused")).items() if k != "FA4CACHE_DIR"}
    full.update(env)
    return cli(*args, env=full, timeout=120)


def test_a_mistyped_store_path_is_said_with_the_fix_and_never_made(tmp_path: Path) -> None:
    typo = tmp_path / "stroe"
    home = tmp_path / "xdg"
    for cmd in ("verify", "ls", "stats"):
        for how, p in (
            ("--cache-dir", _cli("--cache-dir", str(typo), cmd, XDG_CACHE_HOME=str(home))),
            ("FA4CACHE_DIR=", _cli(cmd, FA4CACHE_DIR=str(typo), XDG_CACHE_HOME=str(home))),
        ):
            assert p.returncode == 2 and p.stdout == "", (cmd, how, p.stdout)
            line = p.stderr.strip()
            assert len(line.splitlines()) == 1, line
            assert line.startswith(f"fa4cache {cmd}: {how}") and f"{typo} is not a store" in line, line
            assert "the directory does not exist" in line and "check the path" in line, line
            assert f"the default store is {home / 'fa4cache'}" in line, line
    assert not typo.exists() and not home.exists()
    # A directory that holds something else is said so, and left as it was (ls made a store's
    # folders in it).
    other = tmp_path / "home"
    other.mkdir(mode=0o700)
    (other / "notes.txt").write_text("mine")
    for cmd in ("verify", "ls", "stats"):
        p = _cli("--cache-dir", str(other), cmd)
        assert p.returncode == 2 and "the directory holds no store" in p.stderr, (cmd, p.stderr)
    assert sorted(x.name for x in other.iterdir()) == ["notes.txt"]
    # The default directory on a machine where nothing was cached: no path to have mistyped.
    p = _cli("stats", XDG_CACHE_HOME=str(home))
    assert p.returncode == 0 and p.stdout.startswith(f"no store at {home / 'fa4cache'} yet: 0 entries"), (
        p.stderr
    )
    assert not home.exists()


# ---------------------------------------------------------------- verify --rebuild N that rebuilt nothing


def test_verify_rebuild_that_rebuilt_nothing_says_so_and_fails(tmp_path: Path) -> None:
    from fa4cache.store.store import Store

    empty = tmp_path / "empty"
    Store.at(empty)  # a store with no entries
    p = run_cli(empty, "verify", "--rebuild", "1")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "nothing was rebuilt, so no entry was verified: the store holds no entries" in p.stdout, p.stdout
    bare = tmp_path / "bare"
    assert _load(bare, "job") == 1  # an entry a job compiled: it records no spec to rebuild from
    for n in (["1"], []):
        p = run_cli(bare, "verify", "--rebuild", *n)
        assert p.returncode == 1, (n, p.stdout + p.stderr)
        assert "1 not rebuilt" in p.stdout and "no entry records a spec" in p.stdout, p.stdout


# ---------------------------------------------------------------- exit statuses are documented


def test_every_store_command_documents_its_exit_statuses_in_help_and_reference() -> None:
    from fa4cache.cli import markdown_reference

    for cmd in ("stats", "ls", "verify", "prune", "clear"):
        p = _cli(cmd, "--help")
        text = " ".join(p.stdout.split())
        assert p.returncode == 0 and "exit status: 0" in text and "holds no store" in text, (cmd, text)
    for cmd in ("prune", "clear"):  # declined at the confirmation: nothing removed, exit 1, as apt-get
        text = " ".join(_cli(cmd, "--help").stdout.split())
        assert "the confirmation was answered no (nothing removed; as apt-get's abort)" in text, text
    verify = " ".join(_cli("verify", "--help").stdout.split())
    assert "nothing rebuilt" in verify and "if nothing was rebuilt" in verify, verify
    ref = markdown_reference()
    assert ref.count("Exit status: 0") == 5, ref


# ---------------------------------------------------------------- --dry-run's columns line up


def test_dry_run_lists_line_up_whatever_the_kinds(tmp_path: Path) -> None:
    from fa4cache.store.paths import EntryRef
    from fa4cache.store.store import Store

    d = tmp_path / "cache"
    store = Store.at(d)
    tc = "0123456789abcdef0123"
    store.record_toolchain(tc, {"id": tc})
    for n, kind in enumerate(("fwd", "bwd", "bwd_postprocess_convert", "bwd_preprocess"), 1):
        assert store.publish_bytes(EntryRef(tc, kind, f"{n:064x}"), b"\x7fELF" + bytes(1000 * n), summary={})
    for cmd in (["prune", "--max-size", "1B", "--dry-run"], ["clear", "--dry-run"]):
        p = run_cli(d, *cmd)
        rows = [ln for ln in p.stdout.splitlines() if ln.startswith("would remove ") and "toolchain" in ln]
        assert p.returncode == 0 and len(rows) == 4, p.stdout + p.stderr
        for field in ("0000000000000", "toolchain"):  # the digest and (after the sizes) toolchain columns
            assert len({ln.index(field) for ln in rows}) == 1, (field, rows)
