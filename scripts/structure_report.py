"""The import graph of fa4cache, in numbers: floors inside ``adapters/``, the largest module,
class and function, import circles, upward imports, the CLI's reach into the adapters, and
the public methods of ``Store``.

Usage: python scripts/structure_report.py [--json]   (from the repository root)

``tests/test_structure.py`` builds its layering checks on the same graph (:func:`modules`,
:func:`imports`), so the report and the test answer one question one way.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"fa4cache": ROOT / "fa4cache", "fa4cache.adapters": ROOT / "adapters",
                "fa4cache.ray_integration": ROOT / "ray_integration"}  # fmt: skip


@cache
def modules() -> dict[str, Path]:
    """Every project module by its installed name."""
    mods = {}
    for pkg, d in PACKAGE_DIRS.items():
        for path in sorted(d.rglob("*.py")):
            parts = list(path.relative_to(d).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = path
    return mods


def imports(name: str) -> set[str]:
    """Project modules ``name`` imports anywhere in its body (relative imports resolved), and
    those it names in full in a string (lazy imports, ``python -m``)."""
    mods = modules()
    path = mods[name]
    out = set()
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            parts = base[: len(base) - node.level + 1] if node.level else []
            mod = ".".join(parts + ([node.module] if node.module else []))
            subs = {f"{mod}.{a.name}" for a in node.names} & set(mods)
            out |= subs or ({mod} & set(mods))
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names} & set(mods)
        elif isinstance(node, (ast.Dict, ast.List, ast.Tuple)):
            # A lazy face's table of modules, or ``[python, "-m", module]``: an edge too (a
            # logger named after a module is not).
            for v in node.values if isinstance(node, ast.Dict) else node.elts:
                if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value in mods:
                    out.add(v.value)
    return out - {name}


def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports; a package face re-exporting its own
    modules (and the lazy ``fa4cache`` face) is not an edge."""
    g = {n: {d for d in imports(n) if d != "fa4cache"} for n in modules()}
    return {n: {d for d in deps if not d.startswith(n + ".")} for n, deps in g.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(n: str) -> None:
        index[n] = low[n] = len(index)
        stack.append(n)
        on.add(n)
        for d in sorted(g.get(n, ())):
            if d not in index:
                visit(d)
                low[n] = min(low[n], low[d])
            elif d in on:
                low[n] = min(low[n], index[d])
        if low[n] == index[n]:
            group = []
            while True:
                m = stack.pop()
                on.discard(m)
                group.append(m)
                if m == n:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for n in sorted(g):
        if n not in index:
            visit(n)
    return out


def floors(g: dict[str, set[str]], within: str) -> tuple[int, list[str]]:
    """The longest import chain among the modules under ``within`` (an acyclic graph)."""
    inside = {n for n in g if n.startswith(within + ".")}

    @cache
    def longest(n: str) -> tuple[str, ...]:
        best: tuple[str, ...] = ()
        for d in g[n] & inside:
            chain = longest(d)
            if len(chain) > len(best):
                best = chain
        return (n, *best)

    chains = [longest(n) for n in sorted(inside)]
    top = max(chains, key=len, default=())
    return len(top), list(top)


def largest() -> dict[str, tuple[str, int]]:
    """The largest module, class and function, by lines."""
    best = {"module": ("", 0), "class": ("", 0), "function": ("", 0)}
    for name, path in modules().items():
        text = path.read_text()
        n = len(text.splitlines())
        if n > best["module"][1]:
            best["module"] = (name, n)
        for node in ast.walk(ast.parse(text)):
            kind = ("class" if isinstance(node, ast.ClassDef)
                    else "function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)  # fmt: skip
            if kind:
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > best[kind][1]:
                    best[kind] = (f"{name}.{node.name}", size)
    return best


def public_methods(module: str, cls: str) -> list[str]:
    """The public methods of class ``cls`` in ``module`` (those written in its body)."""
    for node in ast.parse(modules()[module].read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [
                f.name
                for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and not f.name.startswith("_")
            ]
    return []


def reach(g: dict[str, set[str]], start: str, into: str) -> set[str]:
    """Modules under ``into`` that ``start``'s modules import, directly or not."""
    seen: set[str] = set()
    todo = [n for n in g if n == start or n.startswith(start + ".")]
    while todo:
        n = todo.pop()
        for d in g[n]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return {n for n in seen if n.startswith(into + ".") or n == into}


def report() -> dict[str, object]:
    g = graph()
    depth, chain = floors(g, "fa4cache.adapters")
    cli = {n: g[n] for n in g if n.startswith("fa4cache.cli")}
    direct = {d for deps in cli.values() for d in deps if d.startswith("fa4cache.adapters")}
    return {
        "modules": len(g),
        "adapters_modules": sum(n.startswith("fa4cache.adapters.") for n in g),
        "adapters_floors": depth,
        "adapters_longest_chain": chain,
        "largest": largest(),
        "import_circles": circles(g),
        "cli_imports_of_adapters_direct": sorted(direct),
        "cli_reach_into_adapters": len(reach(g, "fa4cache.cli", "fa4cache.adapters")),
        "store_public_methods": public_methods("fa4cache.store.store", "Store"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    r = report()
    if p.parse_args().json:
        print(json.dumps(r, indent=1))
        return 0
    big = r["largest"]
    assert isinstance(big, dict)
    print(f"modules                {r['modules']} ({r['adapters_modules']} in adapters)")
    print(
        f"floors in adapters     {r['adapters_floors']}: "
        + " -> ".join(m.removeprefix("fa4cache.adapters.") for m in r["adapters_longest_chain"])
    )  # type: ignore[union-attr]
    for kind in ("module", "class", "function"):
        print(f"largest {kind:<14} {big[kind][0]} ({big[kind][1]} lines)")
    print(f"import circles         {len(r['import_circles'])}")  # type: ignore[arg-type]
    print(
        f"CLI -> adapters        {len(r['cli_imports_of_adapters_direct'])} direct, "  # type: ignore[arg-type]
        f"{r['cli_reach_into_adapters']} reached"
    )
    methods = r["store_public_methods"]
    assert isinstance(methods, list)
    print(f"Store public methods   {len(methods)}: {' '.join(methods)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
