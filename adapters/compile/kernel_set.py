"""The kernels a step asks for, one by one: list them by FA4's own compile keys, and
compile any one of them alone.

A *job* is something that runs FA4 on fake CUDA tensors: a :class:`SpecJob` (what
``warm`` compiles for a :class:`~fa4cache.aot.spec.KernelSpec`) or a :class:`CallJob` (one
FA4 entry point called with the layouts of a real call, for compile-ahead). Under
``FakeTensorMode`` FA4 checks each kernel's key in its compile cache and never calls
the kernel, so a selector (:func:`fa4cache.adapters.fa4.compile_cache.select`) that answers
"present" for every key but one lists a job's kernels (:func:`plan`) or compiles a
single kernel of it (:func:`compile_one`), through the store's usual miss path: the
per-key lock makes every kernel compile once, whoever asks for it.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fa4cache.adapters.fa4 import compile_cache

from fa4cache.aot.spec import KernelSpec
from fa4cache.store.locks import release

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernel:
    """One kernel of a job: the store kind and key digest of an FA4 compile key."""

    kind: str
    digest: str


@dataclass(frozen=True)
class SpecJob:
    spec: dict[str, Any]  # KernelSpec.to_dict(): picklable without fa4cache's classes changing

    def run(self) -> None:
        from fa4cache.adapters.compile.warm_specs import compile_spec

        compile_spec(KernelSpec.from_dict(self.spec))

    def label(self) -> str:
        return KernelSpec.from_dict(self.spec).label()


@dataclass(frozen=True)
class TensorMeta:
    """A tensor's layout, rebuilt as a fake CUDA tensor in the worker."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool = False


@dataclass(frozen=True)
class CallJob:
    """``flash_attn.cute.interface.<entry>(*args, **kwargs)`` with tensors as :class:`TensorMeta`."""

    entry: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self) -> None:
        from flash_attn.cute import interface as fi
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            args = _rebuild(self.args)
            kwargs = _rebuild(self.kwargs)
            getattr(fi, self.entry)(*args, **kwargs)

    def label(self) -> str:
        return self.entry.strip("_")


@dataclass(frozen=True)
class CodeRef:
    """A mask_mod / score_mod by name, with the key its requester computed for it
    (:func:`fa4cache.adapters.fa4.keys.base_hash`). The worker resolves it and compiles only if its own key
    for the object it found is the same: a constant the requester set at run time, or a
    module edited since, must never have the worker publish bytes of other code under the
    requester's key."""

    module: str
    qualname: str
    key: str
    template: tuple[str, tuple[tuple[str, Any], ...]] | None = None  # (template name, spec)

    def resolve(self) -> Any:
        import importlib

        from fa4cache.adapters.fa4.keys import base_hash

        from fa4cache.masks.template import MaskTemplate

        mod = importlib.import_module(self.module)
        if self.template is not None:
            name, spec = self.template
            found = next(
                (o for o in vars(mod).values() if isinstance(o, MaskTemplate) and o.name == name), None
            )
            if found is None:
                raise LookupError(f"no mask template {name!r} in {self.module}")
            obj = found(**dict(spec))
        else:
            obj = mod
            for part in self.qualname.split("."):
                obj = getattr(obj, part)
        if base_hash(obj) != self.key:
            raise LookupError(
                f"{self.module}.{self.qualname} is other code in this worker than in the process that asked "
                "(a constant set at run time, or a file edited since): that process compiles it itself"
            )
        return obj


def _code_ref(value: Any) -> CodeRef:
    from fa4cache.adapters.fa4.keys import base_hash

    from fa4cache.identity import MEMORY_ONLY

    key = base_hash(value)
    if key.startswith(MEMORY_ONLY):
        raise TypeError("a callable no key describes completely stays in its process")
    info = getattr(value, "__fa4cache_mask__", None)
    if isinstance(info, dict):
        return CodeRef(value.__module__, "", key, (info["template"], tuple(sorted(info["spec"].items()))))
    qualname = getattr(value, "__qualname__", "")
    if "<locals>" in qualname or "<lambda>" in qualname or not qualname:
        raise TypeError(f"{qualname or value!r} is not reachable by name from another process")
    return CodeRef(value.__module__, qualname, key)


def describe(value: Any) -> Any:
    """``value`` with every tensor (also inside tuples, lists, dicts, named tuples) as a
    :class:`TensorMeta`; raises ``TypeError`` for what cannot travel to another process."""
    import torch

    if isinstance(value, torch.Tensor):
        return TensorMeta(
            tuple(value.shape), tuple(value.stride()), str(value.dtype).removeprefix("torch."), False
        )
    if callable(value) and not isinstance(value, type):
        # Never by reference (pickle): by name and key, checked where it lands.
        return _code_ref(value)
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(describe(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(describe(v) for v in value)
    try:
        pickle.dumps(value)
    except Exception as e:
        raise TypeError(f"{type(value).__name__} cannot be sent to a compile worker ({e})") from None
    return value


def _rebuild(value: Any) -> Any:
    import torch

    if isinstance(value, TensorMeta):
        return torch.empty_strided(
            value.shape, value.stride, dtype=getattr(torch, value.dtype), device="cuda"
        )
    if isinstance(value, CodeRef):
        return value.resolve()
    if isinstance(value, dict):
        return {k: _rebuild(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_rebuild(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v) for v in value)
    return value


@contextmanager
def _selecting(selector: Callable[[Any, Any], bool]) -> Iterator[None]:
    prev = compile_cache.select(selector)
    try:
        yield
    finally:
        compile_cache.select(prev)


def plan(run: Callable[[], None]) -> list[Kernel]:
    """The kernels ``run`` (a job's ``run``, on fake tensors) asks for, in order, that are not
    in this process's memory; nothing is compiled or loaded. Needs ``install()``."""
    seen: dict[str, Kernel] = {}

    def record(cache: Any, key: Any) -> bool:
        ref = cache.ref(key)
        seen.setdefault(ref.digest, Kernel(ref.kind, ref.digest))
        return True

    with _selecting(record):
        run()
    return list(seen.values())


def compile_one(run: Callable[[], None], kernel: Kernel, held: Any = None) -> str:
    """Compile ``kernel`` of ``run`` alone, through the store's miss path; ``held``: its
    lock, already taken (it is released whatever happens). Returns ``"compiled"``,
    ``"present"`` (the store had it) or ``"absent"`` (``run`` never asked for it)."""
    outcome = ["absent"]
    lock = [held]

    def only(cache: Any, key: Any) -> bool:
        if outcome[0] != "absent" or cache.kind != kernel.kind or cache.ref(key).digest != kernel.digest:
            return True
        hit = cache._miss(key, held=lock[0])
        lock[0] = None  # the miss path owns it now
        outcome[0] = "present" if hit else "compiled"
        return hit

    try:
        with _selecting(only):
            run()
    finally:
        release(lock[0])
    return outcome[0]
