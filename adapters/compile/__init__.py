"""The compile service: kernels compiled ahead of the step that needs them, in a server
process beside the job, or in parallel for ``fa4cache warm``.

Its face is the few calls other layers make; the rest (tasks, the server, its workers, the
planner) is this package's own business. Names load on first use: the CLI imports this
face without importing torch or FA4.

* :func:`warm`: the one warm runner (``fa4cache.warm``): a plan's items into the store, in
  this process, over ``-j`` workers, split across a job's nodes, or in the background (a
  :class:`Warming` handle at once: a model's kernel set at model load); one
  :class:`WarmReport` (the CLI's ``warm``, Ray's prewarm);
* :func:`rebuild`: ``verify --rebuild``'s clean compiles to compare bytes against.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

# name -> the module that defines it (full names: the structure report follows them).
_FACE = {
    "warm": "fa4cache.adapters.compile.runner",
    "WarmReport": "fa4cache.adapters.compile.report",
    "WarmRow": "fa4cache.adapters.compile.report",
    "default_jobs": "fa4cache.adapters.compile.task",
    "quack_calls": "fa4cache.adapters.compile.warm_jit_calls",
    "Warming": "fa4cache.adapters.compile.background",
    "rebuild": "fa4cache.adapters.compile.rebuild_check",
}

__all__ = sorted(_FACE)


def __getattr__(name: str) -> _typing.Any:
    if name in _FACE:
        return getattr(_importlib.import_module(_FACE[name]), name)
    try:  # a submodule by attribute, as after ``import fa4cache`` (its own names stay apart)
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACE))
