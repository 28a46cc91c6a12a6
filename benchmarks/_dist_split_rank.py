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
    from fa4cache.adapters.compile.kernel_set import SpecJob
    from fa4cache.adapters.distributed.split import warm_across

    import fa4cache
    from fa4cache.aot.spec import KernelSpec

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = fa4cache.install(base / f"node-{rank}", distributed=True, compile_server=False)
    import flash_attn.cute.interface  # noqa: F401  (imports are not compile time)

    jobs = [SpecJob(KernelSpec(head_dim=h, mask=m, heads=2, seqlen=256).to_dict()) for h in head_dims for m in masks]
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    res = warm_across(jobs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    store.counters.flush()
    out = {"rank": rank, "kernels": res.kernels, "claimed": res.claimed, "compiled_later": res.compiled_later,
           "fetched": store.counters.values["remote_hits"], "compile_seconds": res.compile_seconds,
           "wall": wall, "cpu": cpu, "fetch_seconds": store.counters.values["remote_seconds"]}  # fmt: skip
    (base / f"result-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
