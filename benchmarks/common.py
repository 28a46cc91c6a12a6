"""Helpers shared by the benchmark scripts: tables printed and saved as Markdown + JSON."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["gpus"] = torch.cuda.device_count()
    except Exception:
        pass
    from importlib import metadata

    for d in ("flash-attn-4", "nvidia-cutlass-dsl"):
        try:
            info[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            pass
    return info


def doc_lengths(total: int, rng: Any, lo: int = 256, hi: int = 4096) -> list[int]:
    """Random document lengths in [lo, hi] that add up to ``total`` (the last one shorter)."""
    out, left = [], total
    while left > 0:
        n = min(left, rng.randint(lo, hi))
        out.append(n)
        left -= n
    return out


def cu_seqlens(lens: list[int]) -> Any:
    """FA4 varlen's ``cu_seqlens`` of documents of ``lens`` tokens: int32 on the GPU."""
    import torch

    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)


def document_ids(lens: list[int], device: str = "cuda") -> Any:
    """The document index of every token of documents of ``lens`` tokens, packed in one row."""
    import torch

    return torch.repeat_interleave(torch.arange(len(lens), device=device), torch.tensor(lens, device=device))


@dataclass(frozen=True)
class PackedRow:
    """One packed row of ``T`` tokens of documents, bf16, in both layouts FA4 takes: varlen
    (``q``: [T, H, D] with ``cu``) and batch (``q4``: [1, T, H, D], its own leaf tensors)."""

    T: int
    H: int
    D: int
    lens: list[int]
    cu: Any
    maxlen: int
    q: Any
    k: Any
    v: Any
    dout: Any
    q4: Any
    k4: Any
    v4: Any
    dout4: Any


def packed_row(T: int, lens: list[int], H: int, D: int) -> PackedRow:
    import torch

    cu = cu_seqlens(lens)
    maxlen = max(lens)
    q, k, v = (
        torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    dout = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v))
    return PackedRow(T, H, D, lens, cu, maxlen, q, k, v, dout, q4, k4, v4, dout.unsqueeze(0))


def install_fa4cache() -> None:
    """Load torch, triton's timer and FA4, then route FA4's compile caches through fa4cache,
    in the order the GPU benchmarks always did."""
    import torch  # noqa: F401
    import triton.testing  # noqa: F401
    from flash_attn.cute import flash_attn_func  # noqa: F401

    import fa4cache
    import fa4cache.masks  # noqa: F401

    fa4cache.install()


def bench_ms(fn: Any, rep: int = 200) -> float:
    """Median milliseconds per call of ``fn`` (triton.testing.do_bench: 25 ms warm-up, ``rep`` ms timed)."""
    import triton.testing as tt

    return float(tt.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def first(x: Any) -> Any:
    """The output of an FA4 call that returns (out, lse) or out alone."""
    return x[0] if isinstance(x, tuple) else x


def rel_err(o: Any, ref: Any) -> float:
    return float((o - ref).norm() / ref.norm())


def causal_pairs(lens: list[int], window: int | None = None) -> float:
    """Visible (query, key) pairs of causal documents of ``lens`` tokens, each query seeing
    at most ``window`` earlier keys."""
    if window is None:
        return sum(n * (n + 1) / 2 for n in lens)
    return sum(sum(min(m + 1, window + 1) for m in range(n)) for n in lens)


def interleaved_ms(fns: dict[str, Any], rounds: int = 7, budget_ms: float = 40.0) -> dict[str, float]:
    """Median milliseconds per call of each function, timed as a training loop runs them:
    back-to-back calls between two CUDA events (the host queues ahead, so its overhead
    hides behind the GPU unless it is the bottleneck), in ``rounds`` rounds that alternate
    the functions, so that clock and thermal drift fall on all of them alike."""
    import torch

    iters = {}
    for name, fn in fns.items():  # warm up, and size each round to about budget_ms
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        per = (time.perf_counter() - t0) * 1e3 / 5
        iters[name] = max(3, min(200, int(budget_ms / max(per, 1e-3))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters[name]):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / iters[name])
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"
        return str(x)

    cells = [[fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def save(name: str, title: str, sections: list[tuple[str, str]], data: dict[str, Any]) -> None:
    out_dirs = [Path(os.environ.get("FA4CACHE_RESULTS", RESULTS))]
    env = environment()
    md = [f"# {title}", "", "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), ""]
    for heading, body in sections:
        md += [f"## {heading}", "", body, ""]
    text = "\n".join(md)
    print(text, flush=True)
    for d in out_dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.md").write_text(text)
        (d / f"{name}.json").write_text(json.dumps({"environment": env, **data}, indent=2, default=str))
