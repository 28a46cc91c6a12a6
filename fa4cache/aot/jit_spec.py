"""Calls of ``jit_cache`` compile functions as JSON, for ``fa4cache warm`` (manifests and
``--hf-config --with-quack``).

A manifest may mix FA4 kernel specs (:mod:`fa4cache.aot.spec`) with entries naming any
``@fa4cache.jit_cache`` function (or a QuACK ``jit_cache`` function, routed into the store
by ``fa4cache.install()``) by module path and arguments::

    [{"dtype": "bf16", "head_dim": 128, "mask": "document"},
     {"jit": "mypkg.kernels:compile_rowsum",
      "args": [{"type": "cutlass.BFloat16"}, 4096], "kwargs": {"persistent": true}}]

Arguments are JSON values (lists become tuples) or ``{"type": "module.Name"}`` for a type
such as a CuTe dtype. Nothing here imports the module named: that happens when warming.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fa4cache.aot.spec import manifest_entries
from fa4cache.arch import ARCH_ENV, ARCHS
from fa4cache.errors import ConfigError

JIT_KEY = "jit"
_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def is_jit_entry(d: Any) -> bool:
    return isinstance(d, dict) and JIT_KEY in d


def _check_value(v: Any, where: str) -> None:
    if v is None or isinstance(v, (bool, int, float, str)):
        return
    if isinstance(v, list):
        for i, x in enumerate(v):
            _check_value(x, f"{where}[{i}]")
        return
    if isinstance(v, dict) and set(v) == {"type"} and isinstance(v["type"], str) and "." in v["type"]:
        return
    raise ConfigError(
        f'{where}: expected a JSON number, string, bool, null, list or {{"type": "module.Name"}}, got {v!r:.80}'
    )


@dataclass(frozen=True)
class JitCall:
    """One call of a jit-cached compile function: ``module:qualname`` and JSON arguments."""

    function: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    arch: str = "sm_90"
    name: str | None = None  # a short label for the warm table

    def __post_init__(self) -> None:
        if not isinstance(self.function, str) or not _FUNCTION.fullmatch(self.function):
            raise ConfigError(
                f"jit: expected 'package.module:function' (or ':Class.method'), got {self.function!r}"
            )
        if self.arch not in ARCH_ENV:
            raise ConfigError(f"arch: expected one of {', '.join(ARCHS)}, got {self.arch!r}")
        for i, v in enumerate(self.args):
            _check_value(v, f"args[{i}]")
        for k, v in self.kwargs:
            _check_value(v, f"kwargs[{k!r}]")

    @classmethod
    def from_dict(cls, d: Any, *, where: str = "jit entry") -> JitCall:
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(d).__name__}")
        unknown = set(d) - {JIT_KEY, "args", "kwargs", "arch", "name"}
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        args, kwargs = d.get("args", []), d.get("kwargs", {})
        if not isinstance(args, list):
            raise ConfigError(f"{where}: args: expected a JSON list")
        if not isinstance(kwargs, dict):
            raise ConfigError(f"{where}: kwargs: expected a JSON object")
        try:
            return cls(
                function=d[JIT_KEY],
                args=tuple(args),
                kwargs=tuple(sorted(kwargs.items())),
                arch=d.get("arch", "sm_90"),
                name=d.get("name"),
            )
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {JIT_KEY: self.function, "args": list(self.args), "kwargs": dict(self.kwargs)}
        d["arch"] = self.arch
        if self.name:
            d["name"] = self.name
        return d

    def label(self) -> str:
        if self.name:
            return self.name

        def short(v: Any) -> str:
            if isinstance(v, dict):
                return str(v["type"]).rsplit(".", 1)[-1]
            return json.dumps(v)

        parts = [short(v) for v in self.args] + [f"{k}={short(v)}" for k, v in self.kwargs]
        return f"{self.function.rsplit(':', 1)[-1]}({', '.join(parts)})"


def load_jit_manifest(path: str | Path) -> list[JitCall]:
    """The ``jit`` entries of a manifest (FA4 specs are :func:`fa4cache.aot.spec.load_manifest`'s)."""
    p, data = manifest_entries(path)
    return [
        JitCall.from_dict(d, where=f"manifest {p} entry {i}") for i, d in enumerate(data) if is_jit_entry(d)
    ]
