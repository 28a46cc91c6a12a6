"""What a warm run reports: one :class:`WarmRow` per item of its plan, in one
:class:`WarmReport` (the runner's every mode, :mod:`fa4cache.adapters.compile.runner`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fa4cache.aot.plan import Item, Target


@dataclass(frozen=True)
class WarmRow:
    """What warm did for one item of its plan."""

    item: Item
    compiled: int  # kernels compiled by this run
    present: int  # kernels already there: in the store, in this process's memory, or fetched from the job
    seconds: (
        float  # wall time of the item (with -j and split: of the whole run, its kernels ran side by side)
    )
    error: str | None = None
    # Time spent compiling its kernels, counted as ``fa4cache stats`` counts it (miss to publication).
    compile_seconds: float = 0.0
    kernels: int | None = None  # kernels (generation: calls) the item asked for, where known

    @property
    def label(self) -> str:
        return self.item.label()

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class WarmReport:
    """The result of one warm run (one node's, for Ray's ``prewarm``)."""

    target: Target
    rows: tuple[WarmRow, ...] = ()
    seconds: float = 0.0
    cache_dir: str | None = None
    node_id: str | None = None  # Ray's prewarm: the node that ran it
    error: str | None = None  # the run itself failed (a node not alive, a task that died)
    claimed: int = 0  # split: kernels compiled here as this node's share
    left: int = 0  # split: kernels left to other nodes at first (fetched, or compiled if they died)

    @property
    def compiled(self) -> int:
        return sum(r.compiled for r in self.rows)

    @property
    def present(self) -> int:
        return sum(r.present for r in self.rows)

    @property
    def failed(self) -> tuple[tuple[str, str], ...]:
        """``(label, error)`` of each failed item; ``("*", error)`` when the run failed."""
        run = (("*", self.error),) if self.error else ()
        return run + tuple((r.label, r.error) for r in self.rows if r.error is not None)

    @property
    def ok(self) -> bool:
        return not self.failed

    def table(self) -> list[str]:
        """One line per item (columns as wide as the longest label), under a header.

        "compile s" is what ``fa4cache stats`` counts (each kernel from its miss to its
        publication); "wall s" adds masks, FA4's tracing and loads."""
        w = max(len("item"), *(len(r.label) for r in self.rows)) if self.rows else len("item")
        lines = [f"{'item':<{w}}  {'compiled':>8}  {'present':>7}  {'compile s':>9}  {'wall s':>7}  status"]
        for r in self.rows:
            status = "ok" if r.error is None else f"FAILED: {r.error[:80]}"
            lines.append(
                f"{r.label:<{w}}  {r.compiled:>8}  {r.present:>7}  {r.compile_seconds:>9.1f}  "
                f"{r.seconds:>7.1f}  {status}"
            )
        return lines


def row_of(item: Item, r: dict[str, Any], kernels: int | None = None) -> WarmRow:
    """``item``'s row from a result dict (``compiles``, ``present``, ``seconds``, ``error``,
    ``compile_seconds``); ``kernels``: what it asked for, when not their sum."""
    known = r["compiles"] + r["present"] if kernels is None else kernels
    return WarmRow(item, r["compiles"], r["present"], r["seconds"], r["error"], r["compile_seconds"], known)
