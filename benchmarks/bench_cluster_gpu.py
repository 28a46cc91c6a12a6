"""Compile once per cluster, on one H200x2 host: two Ray nodes (``ray.cluster_utils.Cluster``),
one per GPU, each with its own node-local store, joined by ``fa4cache.env(cluster=True)``.

Node 1 takes a training step (document mask, forward + backward) on a cold store and compiles.
Node 2 then takes its first step: every kernel should come from node 1 through Ray (fetch, verify
against the sidecar, publish into node 2's own store, load), with 0 compiles. Then, per kernel,
into a fresh empty store on node 2: fetch + verify + publish ms and load ms, against the seconds
node 1 spent compiling it.

    python benchmarks/bench_cluster_gpu.py        # about 1-2 minutes; tables under $OUT
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

if os.environ.get("OUT") and not os.environ.get("FA4CACHE_RESULTS"):
    os.environ["FA4CACHE_RESULTS"] = str(Path(os.environ["OUT"]) / "benchmarks" / "results")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # one host: loopback only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from common import save, table


class Trainer:
    """One training process on one node, on one GPU (chosen before torch is imported)."""

    def __init__(self, gpu: int) -> None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
        self.gpu = gpu

    def step(self, seed: int) -> dict[str, Any]:
        if os.environ.get("FA4CACHE_BENCH_CPU_SMOKE"):
            return self._cpu_step(seed)
        import random

        import ray
        import torch
        from flash_attn.cute import flash_attn_func

        from fa4cache.masks import make_document_mask
        from fa4cache.store.runtime import installed_store

        store = installed_store()
        assert store is not None and type(store.remote).__name__ == "ClusterTier", (
            "cluster tier not installed"
        )
        rng = random.Random(seed)
        T = rng.randint(4096, 16384)
        cuts = sorted(rng.sample(range(1, T), rng.randint(1, 8)))
        cu = torch.tensor([0, *cuts, T], device="cuda", dtype=torch.int32)
        before = dict(store.counters.values)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mask = make_document_mask(cu, seqlen=T)
        q, k, v = (
            torch.randn(1, T, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        out = flash_attn_func(q, k, v, **mask)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
        torch.cuda.synchronize()
        d = {f: store.counters.values[f] - before[f] for f in before}
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "gpu": torch.cuda.get_device_name(0)
            + f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})",
            "seconds": time.perf_counter() - t0,
            "tokens": T,
            "root": str(store.root),
            **{
                f: d[f]
                for f in (
                    "compiles",
                    "compile_seconds",
                    "disk_hits",
                    "remote_hits",
                    "remote_seconds",
                    "load_seconds",
                )
            },
        }

    def _cpu_step(self, seed: int) -> dict[str, Any]:
        # --cpu-smoke: the same plumbing with a cross-compiled forward kernel (no GPU numbers).
        import ray
        from fa4cache.adapters.compile.warm_specs import compile_spec

        from fa4cache.aot.spec import KernelSpec
        from fa4cache.store.runtime import installed_store

        store = installed_store()
        before = dict(store.counters.values)
        t0 = time.perf_counter()
        compile_spec(KernelSpec(mask="document", backward=False, seqlen=640))
        d = {f: store.counters.values[f] - before[f] for f in before}
        return {"node": ray.get_runtime_context().get_node_id(), "gpu": "cpu", "seconds": time.perf_counter() - t0,
                "tokens": 640, "root": str(store.root), **d}  # fmt: skip

    def entries(self) -> list[dict[str, Any]]:
        from fa4cache.store.runtime import installed_store

        s = installed_store()
        out = []
        for e in s.layout.iter_entries():
            side = s.read_sidecar(e.ref)
            out.append(
                {
                    "ref": [e.ref.toolchain, e.ref.kind, e.ref.digest],
                    "size": e.size,
                    "compile_seconds": side.compile_seconds if side else None,
                }
            )
        return out

    def fetch_each(self, refs: list[list[str]]) -> list[dict[str, Any]]:
        """Per kernel, into a fresh empty store on this node: cluster fetch + verify + publish, then
        load (cute loads a private copy of the verified bytes, as in training). One-time costs
        (importing cutlass, the CUDA context, connecting the store to the cluster) are paid first,
        with kernel 0 into another store, untimed: a training process has paid them already."""
        import dataclasses

        import ray
        from fa4cache.adapters.fa4.artifacts import load_callable

        from fa4cache.store.paths import EntryRef
        from fa4cache.store.runtime import installed_store
        from fa4cache.store.store import Store

        s = installed_store()

        def fresh() -> Store:
            st = Store(dataclasses.replace(s.settings, cache_dir=Path(tempfile.mkdtemp(prefix="fa4fresh-"))))
            assert st.remote is not None and st.remote._connect() is not None, "no cluster tier"
            ray.get(st.remote._server.inventory.remote(), timeout=60)  # its node server is up
            return st

        if not os.environ.get("FA4CACHE_BENCH_CPU_SMOKE"):
            import torch

            torch.zeros(1, device="cuda")
        warm = fresh()
        load_callable(warm.load(EntryRef(*refs[0])))
        timed = fresh()
        rows = []
        for tc, kind, digest in refs:
            ref = EntryRef(tc, kind, digest)
            t0 = time.perf_counter()
            art = timed.load(ref)
            t1 = time.perf_counter()
            assert art is not None and art.tier == "cluster", f"{kind} was not fetched from the cluster"
            load_callable(art)
            t2 = time.perf_counter()
            rows.append(
                {"kind": kind, "fetch_verify_publish_ms": 1e3 * (t1 - t0), "load_ms": 1e3 * (t2 - t1)}
            )
        return rows

    def totals(self) -> dict[str, Any]:
        from fa4cache.store.runtime import installed_store

        s = installed_store()
        s.counters.flush()
        return dict(s.counters.values)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3, help="more steps per node after the first")
    p.add_argument(
        "--cpu-smoke", action="store_true", help="check the plumbing on a CPU host (no GPU numbers)"
    )
    a = p.parse_args()
    if a.cpu_smoke:
        from fa4cache.arch import cross_compile_env

        os.environ.update(cross_compile_env("sm_90"))
        os.environ["FA4CACHE_BENCH_CPU_SMOKE"] = "1"
        os.environ["FA4CACHE_RESULTS"] = tempfile.mkdtemp(prefix="fa4smoke-")

    import ray
    import torch
    from fa4cache.ray_integration.cluster import registry_info, shutdown
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import fa4cache
    from fa4cache.store.stats import collect

    assert a.cpu_smoke or torch.cuda.device_count() >= 2, "needs two GPUs (one per Ray node)"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [c.add_node(num_cpus=4) for _ in range(2)]
    c.wait_for_nodes()
    base = tempfile.mkdtemp(prefix="fa4cluster-")
    ray.init(address=c.address, runtime_env=fa4cache.env(base + "/node-{node_id}", cluster=True))
    cls = ray.remote(num_cpus=1)(Trainer)
    t = [
        cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(w.node_id, soft=False)).remote(i)
        for i, w in enumerate(workers)
    ]
    first1 = ray.get(t[0].step.remote(0))
    ents = ray.get(t[0].entries.remote())
    # Per kernel, before node 2 trains (so node 1 is the only holder): a separate process on
    # node 2 fetches each kernel into an empty store of its own and loads it.
    probe = cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(workers[1].node_id, soft=False))
    per = ray.get(probe.remote(1).fetch_each.remote([e["ref"] for e in ents]))
    first2 = ray.get(t[1].step.remote(1))  # another layout: the same kernels
    later = ray.get([x.step.remote(100 + 10 * i + s) for s in range(a.steps) for i, x in enumerate(t)])
    totals = ray.get([x.totals.remote() for x in t])
    info = registry_info()
    stats = [collect(r["root"]) for r in (first1, first2)]

    steps = [
        [
            "node 1",
            "first step (cold store)",
            first1["tokens"],
            first1["seconds"],
            first1["compiles"],
            first1["remote_hits"],
        ],
        [
            "node 2",
            "first step, after node 1",
            first2["tokens"],
            first2["seconds"],
            first2["compiles"],
            first2["remote_hits"],
        ],
        [
            "both",
            f"{len(later)} more steps, new layouts",
            "-",
            sum(x["seconds"] for x in later),
            sum(x["compiles"] for x in later),
            sum(x["remote_hits"] for x in later),
        ],
    ]
    kernels = []
    for e, r in zip(ents, per):
        total = r["fetch_verify_publish_ms"] + r["load_ms"]
        cs = e["compile_seconds"]
        kernels.append(
            [r["kind"], e["size"], cs if cs is not None else "-", r["fetch_verify_publish_ms"], r["load_ms"], total,
             (cs * 1e3 / total) if cs else "-"]
        )  # fmt: skip
    worst = max(k[5] for k in kernels) if kernels else None
    summary = [
        [
            first1["compiles"],
            first2["compiles"],
            len(kernels),
            worst,
            min(float(k[2]) for k in kernels if k[2] != "-") if kernels else "-",
            sum(s["served"] for s in stats),
            info.get("copies") if info else "-",
        ]
    ]
    save(
        "cluster_h200x2",
        "Compile once per cluster: two Ray nodes on one H200x2 host, separate node-local stores",
        [
            (
                "Steps",
                table(["node", "step", "tokens", "seconds", "compiles", "fetched from the cluster"], steps),
            ),
            (
                "Per kernel: fetched into an empty store on node 2 vs compiled on node 1",
                table(
                    [
                        "kind",
                        "bytes",
                        "compile s (node 1)",
                        "fetch+verify+publish ms",
                        "load ms",
                        "total ms",
                        "compile / total",
                    ],
                    kernels,
                ),
            ),
            (
                "Summary",
                table(
                    [
                        "node 1 compiles",
                        "node 2 first-step compiles",
                        "kernels",
                        "worst fetch+verify+load ms",
                        "fastest compile s",
                        "kernels served by node servers",
                        "copies in the registry",
                    ],
                    summary,
                ),
            ),
        ],
        {
            "steps": [first1, first2, *later],
            "kernels": kernels,
            "totals": totals,
            "registry": info,
            "stats": stats,
        },
    )
    ok = first2["compiles"] == 0 and first2["remote_hits"] > 0
    print(f"node 2 first step: {first2['compiles']} compiles, {first2['remote_hits']} kernels fetched; "
          f"worst fetch+verify+load {worst} ms per kernel; {'OK' if ok else 'FAILED'}")  # fmt: skip
    shutdown()
    ray.shutdown()
    c.shutdown()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
