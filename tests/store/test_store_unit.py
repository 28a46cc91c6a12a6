"""Store and settings behaviour that needs no compile: size cap, placeholders, parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa4cache.cache_dir import resolve_path
from fa4cache.errors import ConfigError
from fa4cache.settings import Settings, parse_duration, parse_size
from fa4cache.store import EntryRef, Store


def test_max_size_is_enforced_after_each_publish(tmp_path: Path) -> None:
    from tests.helpers.fake_compiler import FakeFA4

    store = Store.at(tmp_path / "c", max_size=5_000)
    fa4 = FakeFA4(store)
    for key in range(8):
        assert fa4.call(key, 1) == key + 1
    sizes = [e.size for e in store.layout.iter_entries()]
    assert sum(sizes) <= 5_000 and len(sizes) >= 1
    assert store.counters.values["evictions"] >= 8 - len(sizes)
    # The most recent publish survives the cap: a fresh process-like cache loads it, compiling 0.
    fresh = FakeFA4(Store.at(tmp_path / "c"))
    assert fresh.call(7, 1) == 8 and fresh.compiles == 0


def test_sizes_durations_and_placeholders(tmp_path: Path) -> None:
    assert parse_size("2G") == 2 << 30 and parse_size("500M") == 500 << 20 and parse_size("1.5K") == 1536
    assert parse_duration("30d") == 30 * 86400 and parse_duration("15m") == 900
    with pytest.raises(ConfigError, match="cannot parse size"):
        parse_size("lots")
    p = resolve_path(str(tmp_path / "c-{user}-{hostname}"), setting="FA4CACHE_DIR", node_id="n1")
    assert "{" not in str(p)
    assert resolve_path("/x/{node_id}", setting="s", node_id="../evil").name == ".._evil"
    with pytest.raises(ConfigError, match="unknown placeholder"):
        resolve_path("/x/{rack}", setting="FA4CACHE_DIR")


def test_bad_environment_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FA4CACHE_LOCK_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="FA4CACHE_LOCK_TIMEOUT"):
        Settings.from_env(tmp_path)
    monkeypatch.delenv("FA4CACHE_LOCK_TIMEOUT")
    monkeypatch.setenv("FA4CACHE_DIR", "relative/path")
    with pytest.raises(ConfigError, match="FA4CACHE_DIR: cache directory must be an absolute path"):
        Settings.from_env()
    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FA4CACHE_MAX_SIZE", "2X")
    with pytest.raises(ConfigError, match="FA4CACHE_MAX_SIZE"):
        Settings.from_env()


def test_refs_cannot_carry_paths() -> None:
    with pytest.raises(ConfigError):
        EntryRef("ab" * 10, "../fwd", "0" * 64)
    with pytest.raises(ConfigError):
        EntryRef("ab" * 10, "fwd", "../../etc/passwd")


def test_counter_compaction_keeps_totals_and_never_double_counts(tmp_path: Path) -> None:
    import json
    import socket

    from fa4cache.store import counters

    d = tmp_path / "stats"
    d.mkdir(mode=0o700)
    host = socket.gethostname()
    for i in range(5):
        # pids far above pid_max: these processes are certainly gone
        obj = {
            "host": host,
            "pid": 4_000_000 + i,
            "updated": 0,
            "counters": {"compiles": 1, "disk_hits": 2},
            "by_kind": {},
        }
        (d / f"{host}~{4_000_000 + i}~t{i}.json").write_text(json.dumps(obj))
    before = counters.aggregate(d)["counters"]
    assert counters.compact(d) == 5
    after = counters.aggregate(d)["counters"]
    assert before == after and after["compiles"] == 5 and after["disk_hits"] == 10
    assert not list(d.glob(f"{host}~*.json"))
    # A crash between writing the archive and deleting the files: the names are in the
    # archive's merged list, so the files are not counted twice.
    archive = json.loads((d / "archive.json").read_text())
    (d / f"{host}~4000009~tz.json").write_text(
        json.dumps({"host": host, "counters": {"compiles": 7}, "by_kind": {}, "updated": 0})
    )
    archive["merged"] = [f"{host}~4000009~tz.json"]
    archive["by_host"][host]["counters"]["compiles"] += 7
    (d / "archive.json").write_text(json.dumps(archive))
    assert counters.aggregate(d)["counters"]["compiles"] == 12


def test_counters_flushed_from_many_threads_keep_every_count(tmp_path: Path) -> None:
    """Threads that count and flush at the same moment (a Ray actor serving fetches on
    several threads): once they are done, the file on disk holds every count, whatever
    order their flushes ran in. Checked after each of many rounds."""
    import os
    import random
    import sys
    import threading

    from fa4cache.store import counters

    seed = int(os.environ.get("FA4CACHE_FUZZ_SEED", "0"))
    rng = random.Random(seed)
    threads, rounds = rng.randint(3, 6), rng.randint(150, 250)
    print(f"seed {seed}: {threads} threads x {rounds} rounds")
    d = tmp_path / "stats"
    d.mkdir(mode=0o700)
    c = counters.Counters(d)
    start, done = threading.Barrier(threads + 1), threading.Barrier(threads + 1)

    def serve() -> None:
        for _ in range(rounds):
            start.wait()
            c.add("served")
            c.flush()
            done.wait()

    ts = [threading.Thread(target=serve) for _ in range(threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave as on a busy host, not in 5 ms slices
    lost = []
    try:
        for t in ts:
            t.start()
        for r in range(1, rounds + 1):
            start.wait()
            done.wait()
            on_disk = counters.aggregate(d)["counters"]["served"]
            if on_disk != r * threads:
                lost.append((r, on_disk))
    finally:
        sys.setswitchinterval(interval)
        for t in ts:
            t.join()
    assert not lost, f"seed {seed}: rounds whose counts did not reach the disk: {lost[:5]}"
