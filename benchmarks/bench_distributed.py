"""Issue 38: a cold kernel set split across a torchrun job's nodes, against one node.

Runs two real ``torchrun`` jobs (gloo, CPU, real FA4 cross-compiles for sm_90): one "node"
(one rank, one store), then ``--nodes`` nodes (one rank each, each its own store), each
warming the same kernel set through ``fa4cache.warm(specs, split=True)``.
A node's compile time is measured as its process CPU seconds during the warm (on a machine
with fewer cores than nodes, concurrent compiles share cores, so wall time says less; on a
real cluster each node has its own); wall time is reported too.

    .venv/bin/python benchmarks/bench_distributed.py --nodes 4 --head-dims 64,128 --masks causal,document
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import RESULTS, environment  # noqa: E402

NOTE = (
    "A node's CPU seconds include what is not split: listing the whole set (FA4 called on fake tensors, e"
    "very node) and fetching the others' kernels. The shares are claimed, not assigned: kernels differ in"
    " cost and ranks start at different moments, so the slowest node may compile ceil(K/N)+1."
)


def job(nodes: int, base: Path, head_dims: str, masks: str) -> tuple[list[dict[str, Any]], float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FA4CACHE_COMPILE_AHEAD="0", OMP_NUM_THREADS="1")
    env.pop("FA4CACHE_DIR", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nodes}",
           str(ROOT / "benchmarks" / "_dist_split_rank.py"), str(base), head_dims, masks]  # fmt: skip
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    total = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(p.stdout[-3000:] + p.stderr[-3000:])
    return [json.loads((base / f"result-{r}.json").read_text()) for r in range(nodes)], total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--masks", default="causal,document")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "one").mkdir()
        (Path(d) / "many").mkdir()
        one, _ = job(1, Path(d) / "one", a.head_dims, a.masks)
        many, _ = job(a.nodes, Path(d) / "many", a.head_dims, a.masks)
    k = one[0]["kernels"]
    single = one[0]
    worst_cpu = max(r["cpu"] for r in many)
    worst_wall = max(r["wall"] for r in many)
    rows = [
        ("kernels in the set", f"{k}", f"{k}"),
        ("compiled per node", f"{single['claimed'] + single['compiled_later']}",
         ", ".join(str(r["claimed"] + r["compiled_later"]) for r in many)),
        ("fetched per node", "0", ", ".join(str(r["fetched"]) for r in many)),
        ("fetch + verify + publish per kernel (ms)", "-",
         f"{1000 * sum(r['fetch_seconds'] for r in many) / max(sum(r['fetched'] for r in many), 1):.1f}"),
        ("slowest node: compile CPU seconds", f"{single['cpu']:.1f}", f"{worst_cpu:.1f}"),
        ("slowest node: wall seconds (cores shared)", f"{single['wall']:.1f}", f"{worst_wall:.1f}"),
    ]  # fmt: skip
    ratio_cpu = worst_cpu / single["cpu"]
    ratio_wall = worst_wall / single["wall"]
    env = environment()
    env["cpus"] = os.cpu_count()
    lines = [
        "# A cold kernel set split across a torchrun job's nodes (CPU, gloo)",
        "",
        f"`{' '.join(['.venv/bin/python', 'benchmarks/bench_distributed.py'] + sys.argv[1:])}`",
        "",
        f"Kernel set: FA4 forward+backward for head dims {a.head_dims} x masks {a.masks} (sm_90 cross-compiles,",
        f"heads=2, seqlen=256); {a.nodes} nodes = {a.nodes} ranks of one torchrun job, each with its own store.",
        "",
        f"| | 1 node | {a.nodes} nodes |",
        "|---|---|---|",
        *[f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows],
        "",
        f"**Ratio, slowest of {a.nodes} nodes to one node: {ratio_cpu:.2f} in compile CPU time** "
        f"(ideal 1/{a.nodes} = {1 / a.nodes:.2f}; ceil(K/N)/K = {math.ceil(k / a.nodes) / k:.2f}); "
        f"{ratio_wall:.2f} in wall time on this {env['cpus']}-core machine, where the {a.nodes} nodes' compiles "
        "share the cores (on a cluster each node has its own).",
        "",
        NOTE,
        "",
        f"Environment: {json.dumps(env)}",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    (RESULTS / "distributed_cpu.md").write_text(text)
    (RESULTS / "distributed_cpu.json").write_text(
        json.dumps(
            {"one": one, "many": many, "ratio_cpu": ratio_cpu, "ratio_wall": ratio_wall, "env": env}, indent=1
        )
    )


if __name__ == "__main__":
    main()
