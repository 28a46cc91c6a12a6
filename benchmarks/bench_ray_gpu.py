"""Two Ray actors, one per GPU, training steps with changing document layouts.

Every actor gets the store through ``ray.init(runtime_env=fa4cache.env(...))`` and
nothing else. Actor 0 takes its first step alone (cold), then actor 1 takes its first
step (it should load every kernel), then both run more steps with new layouts.

    python benchmarks/bench_ray_gpu.py --steps 8
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from common import save, table


def trainer_class() -> Any:
    """The Ray actor that takes one document-mask step per call on its GPU."""
    import ray

    @ray.remote(num_gpus=1)
    class Trainer:
        def step(self, seed: int) -> dict[str, Any]:
            import random

            import torch
            from flash_attn.cute import flash_attn_func

            from fa4cache.masks import make_document_mask
            from fa4cache.store.runtime import installed_store

            store = installed_store()
            assert store is not None, "the runtime_env hook did not install fa4cache"
            rng = random.Random(seed)
            T = rng.randint(4096, 16384)
            cuts = sorted(rng.sample(range(1, T), rng.randint(1, 8)))
            cu = torch.tensor([0, *cuts, T], device="cuda", dtype=torch.int32)
            before = store.counters.values["compiles"]
            t0 = time.perf_counter()
            mask = make_document_mask(cu, seqlen=T)
            q, k, v = (
                torch.randn(1, T, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            out = flash_attn_func(q, k, v, **mask)
            (out[0] if isinstance(out, tuple) else out).sum().backward()
            torch.cuda.synchronize()
            return {
                "seconds": time.perf_counter() - t0,
                "compiles": store.counters.values["compiles"] - before,
                "disk_hits": store.counters.values["disk_hits"],
                "gpu": torch.cuda.current_device(),
                "cache_dir": str(store.root),
                "tokens": T,
            }

        def totals(self) -> dict[str, Any]:
            from fa4cache.store.runtime import installed_store

            s = installed_store()
            s.counters.flush()
            return dict(s.counters.values)

    return Trainer


def run_steps(actors: list[Any], steps: int) -> tuple[list[list[Any]], dict[str, Any], list[dict[str, Any]]]:
    """Actor 0's first step alone (cold), then the others' first steps, then ``steps`` more
    on every actor: the rows, actor 0's first step and the others'."""
    import ray

    rows = []
    first0 = ray.get(actors[0].step.remote(0))
    rows.append(["actor 0", "first step (cold)", first0["tokens"], first0["seconds"], first0["compiles"]])
    firsts = ray.get([act.step.remote(i) for i, act in enumerate(actors[1:], 1)])
    for i, f in enumerate(firsts, 1):
        rows.append([f"actor {i}", "first step", f["tokens"], f["seconds"], f["compiles"]])
    later = ray.get([act.step.remote(100 + 10 * i + s) for s in range(steps) for i, act in enumerate(actors)])
    rows.append(
        [
            "all actors",
            f"{len(later)} more steps, new layouts",
            "-",
            sum(x["seconds"] for x in later),
            sum(x["compiles"] for x in later),
        ]
    )
    return rows, first0, firsts


def report(
    actors: list[Any],
    rows: list[list[Any]],
    first0: dict[str, Any],
    firsts: list[dict[str, Any]],
    totals: list[dict[str, Any]],
) -> None:
    total_compiles = sum(t["compiles"] for t in totals)
    summary = [
        [
            len(actors),
            total_compiles,
            first0["compiles"],
            sum(f["compiles"] for f in firsts),
            first0["cache_dir"],
        ]
    ]
    save(
        "ray_h200x2",
        "Ray actors, one per GPU, document-mask steps with changing layouts",
        [
            ("Steps", table(["actor", "step", "tokens", "seconds", "compiles"], rows)),
            (
                "Totals",
                table(
                    [
                        "actors",
                        "compiles in total",
                        "cold actor compiles",
                        "other actors' first-step compiles",
                        "cache dir",
                    ],
                    summary,
                ),
            ),
        ],
        {"rows": rows, "totals": totals},
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--cache-dir", default=None)
    a = p.parse_args()

    import os

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # single machine: loopback only
    import ray
    import torch

    import fa4cache

    gpus = torch.cuda.device_count()
    cache = a.cache_dir or tempfile.mkdtemp(prefix="fa4ray-") + "/cache-{hostname}"
    ray.init(num_gpus=gpus, num_cpus=8, include_dashboard=False, runtime_env=fa4cache.env(cache))
    Trainer = trainer_class()
    actors = [Trainer.remote() for _ in range(max(gpus, 1))]
    rows, first0, firsts = run_steps(actors, a.steps)
    totals = ray.get([act.totals.remote() for act in actors])
    report(actors, rows, first0, firsts, totals)
    ray.shutdown()


if __name__ == "__main__":
    main()
