"""Helpers shared by the benchmark scripts: tables printed and saved as Markdown + JSON."""

from __future__ import annotations

import json
import os
import platform
import time
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
