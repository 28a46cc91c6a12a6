"""FA4 4.0.0b40's forward autotuner under fa4cache, on the GPU (issue 48).

Run twice against one store (``FA4CACHE_DIR``): the first process tunes (its candidates compile
through the store) and keeps the winner there; the second gets the winner with no tuning and no
compile. Each prints one ``RESULT`` JSON line: the tune call's seconds, the store's compiles and
disk hits, and the default and tuned forward's TFLOP/s (CUDA events, median of 50 after 10
warm-up calls, alternating the two).

Usage (on the GPU host, FA4 4.0.0b40 installed): ``python benchmarks/bench_autotune.py``
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Any

B, T, H, D = 2, 8192, 16, 128


def _default_config(fi: Any, kwargs: dict[str, Any]) -> Any:
    """FA4's own config for the call: the first element of the key it compiles under."""
    before = set(fi._flash_attn_fwd.compile_cache.cache)
    fi._flash_attn_fwd(**kwargs)
    new = [k for k in fi._flash_attn_fwd.compile_cache.cache if k not in before]
    keys = new or list(fi._flash_attn_fwd.compile_cache.cache)
    return next(k[0] for k in keys if isinstance(k, tuple) and dataclasses.is_dataclass(k[0]))


def _time(fn: Any) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    import torch

    import fa4cache

    store = fa4cache.install()
    from flash_attn.cute import autotune
    from flash_attn.cute import interface as fi

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kwargs = {"q": q, "k": k, "v": v, "causal": True}
    default = _default_config(fi, kwargs)
    candidates = [default, dataclasses.replace(default, tile_n=64)]
    before = dict(store.counters.counts())
    t0 = time.perf_counter()
    winner = autotune.tune_fwd_config(candidates, kwargs, compile_workers=4)
    tune_s = time.perf_counter() - t0
    store.counters.flush()
    after = store.counters.counts()
    flops = 4 * B * H * T * T * D / 2  # causal: half the scores
    times: dict[str, list[float]] = {"default": [], "tuned": []}
    for _ in range(10):
        fi._flash_attn_fwd(**kwargs, config=default)
        fi._flash_attn_fwd(**kwargs, config=winner)
    for _ in range(50):
        times["default"].append(_time(lambda: fi._flash_attn_fwd(**kwargs, config=default)))
        times["tuned"].append(_time(lambda: fi._flash_attn_fwd(**kwargs, config=winner)))
    tflops = {n: round(flops / (statistics.median(t) * 1e-3) / 1e12, 1) for n, t in times.items()}
    print(
        "RESULT "
        + json.dumps(
            {
                "tune_seconds": round(tune_s, 3),
                "winner": "default" if winner == default else "tile_n=64",
                "compiles": after.get("compiles", 0) - before.get("compiles", 0),
                "disk_hits": after.get("disk_hits", 0) - before.get("disk_hits", 0),
                "tflops": tflops,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
