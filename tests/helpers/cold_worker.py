"""A training-like process for the compile-ahead tests: fa4cache installed, a document mask
on FA4's varlen path, cross-compiled on the CPU (FakeTensorMode: fake CUDA tensors cannot
need gradients on a CPU build, and compile-ahead assumes a backward for a fake call).

Usage: python -m tests.helpers.cold_worker forward|step|hang [--wait-file F] [--seqlen T] [--heads H]
Prints one ``RESULT <json>`` line: this process's counters and its compile workers' pids.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["forward", "step", "hang", "plan"])
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--wait-file", help="start only once this file exists (to line processes up)")
    p.add_argument(
        "--gpu-host", action="store_true", help="answer 'a GPU is visible' (device files) as a GPU host would"
    )
    p.add_argument("--cuda-up", action="store_true", help="say CUDA is initialized here after install()")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch
    from fa4cache.adapters.compile import server as compile_server
    from fa4cache.adapters.compile.warm_specs import fake_varlen_call
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fa4cache
    from fa4cache.masks import make_document_mask

    if a.gpu_host:  # the one thing this machine cannot have: NVIDIA device files
        import fa4cache.arch

        fa4cache.arch.cuda_devices_visible = lambda: True
    store = fa4cache.install()
    from fa4cache.adapters.compile import ahead as compile_ahead

    server_at_install = compile_ahead._server is not None
    configured_before_step = False
    if a.cuda_up:  # this process starts CUDA (its model moved to the GPU): the server learns the target now
        # (said only while the watcher looks: this CPU build's torch has no CUDA to ask further)
        real, torch.cuda.is_initialized = torch.cuda.is_initialized, lambda: True
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not configured_before_step:
            server = compile_ahead._server
            configured_before_step = server is not None and server.configured
            time.sleep(0.01)
        torch.cuda.is_initialized = real
    import flash_attn.cute.interface  # noqa: F401  (imports are not part of a step)

    T, H = a.seqlen, a.heads
    cu = torch.tensor([0, T // 3, T])
    ids = torch.repeat_interleave(torch.arange(2), cu[1:] - cu[:-1]).view(1, T)
    mask = make_document_mask(document_ids=ids)
    if a.action == "plan":
        from fa4cache.adapters.compile.kernel_set import plan

        def job() -> None:
            with FakeTensorMode():
                q, k, v = (torch.empty(1, T, H, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
                fake_varlen_call(mask, q, k, v, backward=True)

        print("RESULT " + json.dumps({"rows": [[k.kind, k.digest] for k in plan(job)]}), flush=True)
        return
    if a.action == "hang":
        import threading

        def report_workers() -> None:  # as soon as the server forked its workers
            while True:
                with compile_server._live_lock:
                    servers = sorted(w.pid for w in compile_server._live)
                children = [c for s in servers for c in _children(s)]
                if children:
                    print("WORKERS " + json.dumps(servers + children), flush=True)
                    return
                time.sleep(0.01)

        threading.Thread(target=report_workers, daemon=True).start()
    if a.wait_file:
        while not os.path.exists(a.wait_file):
            time.sleep(0.01)
    t0 = time.perf_counter()
    with FakeTensorMode():
        q, k, v = (torch.empty(1, T, H, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        fake_varlen_call(mask, q, k, v, backward=a.action == "step")
    seconds = time.perf_counter() - t0
    with compile_server._live_lock:
        pids = sorted(w.pid for w in compile_server._live)
    store.counters.flush()
    print(
        "RESULT "
        + json.dumps(
            {
                "seconds": seconds,
                "counters": store.counters.values,
                "worker_pids": pids,
                "server_at_install": server_at_install,
                "configured_before_step": configured_before_step,
            }
        ),
        flush=True,
    )
    if a.action == "hang":
        time.sleep(3600)


if __name__ == "__main__":
    main()
