"""Process-independent encodings and digests.

Two jobs, both about making a hash mean the same thing in every process:

* :func:`encode_key` turns one of FA4's compile-key tuples into canonical text.
  Python's ``hash()`` is salted per process (``PYTHONHASHSEED``) and ``pickle``
  output depends on object identity and protocol details, so neither may name a file
  that another process must find. Anything without a stable encoding raises
  :class:`~fa4cache.errors.UnstableKeyError` instead of yielding a key that silently
  never hits.
* :func:`source_digest` hashes a function by its source *and* the source of every
  function it reaches (module globals, closure cells, nested helpers), never by
  ``repr()``, which for a nested function embeds a memory address.
"""

from __future__ import annotations

import dis
import enum
import hashlib
import inspect
import json
import math
import textwrap
import types
from collections.abc import Callable, Iterable
from typing import Any

from .errors import UnstableKeyError

KEY_FORMAT = 1


def _encode(value: Any, path: str) -> Any:
    # bool before int: bool is an int subclass, and True must not collide with 1.
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return {"i": str(value)}
    if isinstance(value, float):
        # float.hex is exact and spells nan/inf without JSON extensions.
        return {"f": value.hex() if math.isfinite(value) else repr(value)}
    if isinstance(value, enum.Enum):
        cls = type(value)
        return {"enum": f"{_qualified(cls, path)}.{value.name}"}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {
            "nt": _qualified(type(value), path),
            "v": [_encode(v, f"{path}.{f}") for f, v in zip(value._fields, value)],
        }
    if isinstance(value, (tuple, list)):
        return [_encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, frozenset):
        items = sorted(json.dumps(_encode(v, path + "{}"), sort_keys=True) for v in value)
        return {"set": items}
    if isinstance(value, type):
        return {"type": _qualified(value, path)}
    tname = type(value).__name__
    tmod = type(value).__module__
    if tmod == "torch" and tname == "dtype":
        return {"dtype": str(value)}
    if tmod == "torch" and tname == "device":
        return {"device": str(value)}
    raise UnstableKeyError(
        f"compile-key element {path} of type {tmod}.{tname} has no stable encoding "
        f"(value {value!r:.80}); refusing to build a key that would differ between processes"
    )


def _qualified(cls: type, path: str) -> str:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if "<locals>" in name or "<lambda>" in name:
        raise UnstableKeyError(
            f"compile-key element {path} is a locally defined type {name}; its name does not identify it"
        )
    return name


def encode_key(key: Any) -> str:
    """Canonical text of a compile key; equal keys give equal text in any process."""
    return json.dumps(_encode(key, "key"), sort_keys=True, separators=(",", ":"))


def key_digest(namespace: str, kind: str, encoded: str) -> str:
    """Hex digest naming a store entry; the only key material ever used in a path."""
    h = hashlib.sha256()
    for part in (f"fa4cache-key-v{KEY_FORMAT}", namespace, kind, encoded):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- functions


def _function_source(fn: types.FunctionType) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        # No source (REPL, exec): fall back to the bytecode, which is stable for one
        # interpreter version; the Python tag is part of the toolchain fingerprint.
        return fn.__code__.co_code.hex() + repr(fn.__code__.co_consts)


def _unwrap(fn: Any) -> Any:
    seen = 0
    while seen < 16:
        inner = getattr(fn, "__wrapped__", None) or getattr(fn, "__func__", None)
        if inner is None or inner is fn:
            break
        fn, seen = inner, seen + 1
    return fn


def _global_names(code: types.CodeType) -> Iterable[str]:
    """Names the code (nested code included) reads as globals: ``LOAD_GLOBAL`` /
    ``LOAD_NAME`` only, so an attribute such as ``x.width`` never counts as ``width``."""
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
            yield ins.argval
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


def _value_text(value: Any, where: str) -> str:
    """Stable text for a global or closure value that is not user code to follow."""
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if callable(value) and not isinstance(value, type):
        mod, qn = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if isinstance(mod, str) and isinstance(qn, str) and "<locals>" not in qn:
            return f"callable:{mod}.{qn}"  # library code: covered by the toolchain fingerprint
    try:
        return encode_key(value)
    except UnstableKeyError as e:
        raise UnstableKeyError(
            f"{where} has no stable encoding ({e}); a mask's code may read only constants "
            "(numbers, strings, tuples, enums, types), functions and modules"
        ) from None


def source_digest(
    fn: Callable[..., Any], *extra: str, max_functions: int = 256, follow_classes: bool = False
) -> str:
    """Digest of ``fn``'s source, every function it can reach, and every value they read.

    Reached functions are the globals its code (nested code included) loads and the
    functions held in its closure cells, followed transitively within user code
    (FA4, CUTLASS and torch themselves are covered by the toolchain fingerprint). The
    *values* of the other globals it loads and of its closure cells are hashed too: a
    mask that reads ``WINDOW = 256`` gets another hash when it becomes 512. A value
    without a stable encoding raises :class:`~fa4cache.errors.UnstableKeyError`.
    ``extra`` strings (specialisations, sources the code depends on) are mixed in.
    ``follow_classes``: a user-defined class it reads (a kernel class, as in QuACK's
    ``cute.compile(RMSNorm(...), ...)``) counts by its source and its methods' reach, not
    by its name alone (``jit_cache``; masks keep their hashes).
    """
    h = hashlib.sha256(b"fa4cache-source-v2\0")
    seen: set[int] = set()
    todo: list[Any] = [fn]
    count = 0
    while todo:
        f = _unwrap(todo.pop())
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        count += 1
        if count > max_functions:
            raise UnstableKeyError(f"{fn!r} reaches more than {max_functions} functions; cannot hash it")
        h.update(f"{f.__module__}.{f.__qualname__}\0".encode())
        h.update(_function_source(f).encode())
        h.update(b"\0")
        for name in sorted(set(_global_names(f.__code__))):
            if name not in f.__globals__:
                continue  # a builtin
            target = _unwrap(f.__globals__[name])
            if isinstance(target, types.FunctionType) and _is_user_code(target):
                todo.append(target)
            elif follow_classes and _is_user_class(target):
                if id(target) not in seen:
                    seen.add(id(target))
                    h.update(f"\0class\0{name}\0{_class_source(target)}".encode())
                    todo.extend(_class_functions(target))
            else:
                text = _value_text(target, f"global {name!r} read by {f.__module__}.{f.__qualname__}")
                h.update(f"\0global\0{name}\0{text}".encode())
        for cell_name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            try:
                value = _unwrap(cell.cell_contents)
            except ValueError:  # empty cell
                continue
            if isinstance(value, types.FunctionType) and _is_user_code(value):
                todo.append(value)
            else:
                text = _value_text(value, f"closure value {cell_name!r} of {f.__module__}.{f.__qualname__}")
                h.update(f"\0cell\0{cell_name}\0{text}".encode())
    for e in extra:
        h.update(b"\0extra\0")
        h.update(e.encode())
    return h.hexdigest()


def _is_user_class(value: Any) -> bool:
    return isinstance(value, type) and _is_user_module(value.__module__ or "")


def _class_source(cls: type) -> str:
    try:
        return textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return f"{cls.__module__}.{cls.__qualname__}"  # its functions are still followed


def _class_functions(cls: type) -> list[Any]:
    """Functions defined by ``cls`` and its user-defined bases (methods, static and class
    methods, property accessors)."""
    out: list[Any] = []
    for klass in cls.__mro__:
        if not _is_user_class(klass):
            continue
        for attr in vars(klass).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if isinstance(attr, property):
                out.extend(a for a in (attr.fget, attr.fset, attr.fdel) if a is not None)
            elif callable(attr):
                out.append(attr)
    return out


def _is_user_module(mod: str) -> bool:
    return not mod.startswith(("cutlass", "flash_attn", "torch", "quack", "tvm_ffi", "builtins"))


def _is_user_code(fn: types.FunctionType) -> bool:
    return _is_user_module(fn.__module__ or "")
