"""Import-graph and size figures of the package, for the structure issue's before/after table.

Usage: python scripts/structure_report.py [REPO_ROOT]   (prints one markdown row)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(root: Path) -> dict[str, Path]:
    dirs = {"fa4cache": root / "fa4cache", "fa4cache.adapters": root / "adapters",
            "fa4cache.ray_integration": root / "ray_integration"}  # fmt: skip
    out = {}
    for pkg, d in dirs.items():
        for path in d.rglob("*.py"):
            parts = list(path.relative_to(d).with_suffix("").parts)
            if parts[0] in ("adapters", "ray_integration") and pkg == "fa4cache":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            parts = base[: len(base) - node.level + 1] if node.level else []
            mod = ".".join(parts + ([node.module] if node.module else []))
            subs = {f"{mod}.{a.name}" for a in node.names} & set(mods)
            out |= subs or ({mod} & set(mods))
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names} & set(mods)
    # A package importing its own submodules, and anything importing the package face, is not a circle.
    return {d for d in out - {name} if d != "fa4cache" and not d.startswith(name + ".")}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    mods = modules(root)
    graph = {n: imports(n, p, mods) for n, p in mods.items()}
    cyc = circles(graph)
    biggest_mod = max(mods.items(), key=lambda kv: len(kv[1].read_text().splitlines()))
    cls_best = fn_best = ("", 0)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            size = (getattr(node, "end_lineno", 0) or 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef) and size > cls_best[1]:
                cls_best = (f"{name}.{node.name}", size)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > fn_best[1]:
                fn_best = (f"{name}.{node.name}", size)
    print("| modules | import circles | largest module | largest class | longest function |")
    print("|---|---|---|---|---|")
    print(
        f"| {len(mods)} | {len(cyc)} | {biggest_mod[0]} ({len(biggest_mod[1].read_text().splitlines())}) "
        f"| {cls_best[0]} ({cls_best[1]}) | {fn_best[0]} ({fn_best[1]}) |"
    )
    for c in cyc:
        print(f"circle: {' <-> '.join(c)}")


if __name__ == "__main__":
    main()
