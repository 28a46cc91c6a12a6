"""How fast the CLI answers on a large store (CPU): 10,000 synthetic entries.

Entries are written in the store's real layout (artifact + sidecar) with random bytes;
100 per-process counter files stand in for a busy cluster. Times whole commands,
interpreter start included, and checks that ``import fa4cache`` imports no torch.

    python benchmarks/bench_cli.py [--entries 10000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import save, table


def fill(root: Path, n: int) -> None:
    tc = "0123456789abcdef0123"
    for kind in ("fwd", "bwd", "bwd_preprocess", "bwd_postprocess_convert"):
        (root / "v1" / tc / kind).mkdir(parents=True, mode=0o700, exist_ok=True)
    for sub in ("locks", "quarantine", "stats"):
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    kinds = ["fwd", "bwd", "bwd_preprocess", "bwd_postprocess_convert"]
    now = time.time()
    for i in range(n):
        kind = kinds[i % 4]
        digest = hashlib.sha256(str(i).encode()).hexdigest()
        data = os.urandom(2048)
        d = root / "v1" / tc / kind
        (d / f"{digest}.o").write_bytes(data)
        side = {
            "format": 1,
            "kind": kind,
            "digest": digest,
            "toolchain": tc,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "created": now - i,
            "last_used": now - i,
            "hits": i % 7,
            "compile_seconds": 3.0,
            "summary": {"dtype": "BFloat16", "head_dim": 128},
        }
        (d / f"{digest}.json").write_text(json.dumps(side))
    for p in range(100):
        c = {
            "host": f"node{p % 8}",
            "pid": 1000 + p,
            "started": now,
            "updated": now,
            "counters": {
                "memory_hits": 500,
                "disk_hits": 5,
                "misses": 1,
                "compiles": 1,
                "compile_seconds": 3.0,
            },
            "by_kind": {"fwd": {"memory_hits": 500, "disk_hits": 5, "compiles": 1, "compile_seconds": 3.0}},
        }
        (root / "stats" / f"node{p % 8}~{1000 + p}~abcd{p:04x}.json").write_text(json.dumps(c))


def timed(cmd: list[str], runs: int = 5) -> float:
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--entries", type=int, default=10_000)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fa4cli-")) / "cache"
    root.mkdir(mode=0o700)
    fill(root, a.entries)
    base = [sys.executable, "-m", "fa4cache", "--cache-dir", str(root)]
    rows = [
        ["python -c pass (interpreter start)", timed([sys.executable, "-c", "pass"])],
        ["fa4cache stats --json", timed([*base, "stats", "--json"])],
        ["fa4cache stats", timed([*base, "stats"])],
        ["fa4cache ls --json", timed([*base, "ls", "--json"])],
        ["fa4cache verify", timed([*base, "verify"], runs=3)],
    ]
    imp = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import fa4cache"], capture_output=True, text=True
    )
    heavy = sorted(
        {
            ln.split("|")[-1].strip().split(".")[0]
            for ln in imp.stderr.splitlines()
            if ln.split("|")[-1].strip().split(".")[0] in ("torch", "cutlass", "ray", "flash_attn")
        }
    )
    st = json.loads(
        subprocess.run([*base, "stats", "--json"], capture_output=True, text=True, check=True).stdout
    )
    assert st["entries"] == a.entries
    save(
        "cli_cpu",
        f"CLI on a store of {a.entries:,} entries (CPU, 2 cores)",
        [
            ("Median wall time of the whole command, seconds", table(["command", "seconds"], rows)),
            ("`python -X importtime -c 'import fa4cache'`", f"heavy modules imported: {heavy or 'none'}"),
        ],
        {"rows": rows, "heavy_imports": heavy, "entries": a.entries},
    )


if __name__ == "__main__":
    main()
