"""One rank of bench_distributed.py: warm a kernel set split across the job's nodes
(one rank per node, each with its own store ``<base>/node-<rank>``), on the CPU."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")


def main() -> None:
    base = Path(sys.argv[1])
    head_dims = [int(h) for h in sys.argv[2].split(",")]
    masks = sys.argv[3].split(",")
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    import fa4cache
    from fa4cache.aot.spec import KernelSpec

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = fa4cache.install(base / f"node-{rank}", distributed=True, compile_server=False)
    import flash_attn.cute.interface  # noqa: F401  (imports are not compile time)

    specs = [KernelSpec(head_dim=h, mask=m, heads=2, seqlen=256) for h in head_dims for m in masks]
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    res = fa4cache.warm(specs, split=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    store.counters.flush()
    out = {"rank": rank, "kernels": sum(r.kernels or 0 for r in res.rows), "claimed": res.claimed,
           "compiled_later": res.compiled - res.claimed, "fetched": store.counters.values["remote_hits"],
           "compile_seconds": sum(r.compile_seconds for r in res.rows),
           "wall": wall, "cpu": cpu, "fetch_seconds": store.counters.values["remote_seconds"]}  # fmt: skip
    (base / f"result-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
