"""The store's counters (fa4cache/store/counters.py): compaction and many threads keep every count."""

from __future__ import annotations

from pathlib import Path


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
