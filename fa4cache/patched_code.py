"""Whether the code generators' Python was replaced at run time: FA4, the CUTLASS DSL, QuACK.

The toolchain id digests these packages' *files* (:mod:`fa4cache.fingerprint`); a hot-fix
assigned at run time (``flash_attn.cute.mask.call_mask_mod = my_fix``) changes the kernels
those files describe without changing a byte of them, so a store would serve the unpatched
kernels to patched code and the other way round. :func:`runtime_patches` looks, once, at the
functions the imported modules of these packages hold: module-level functions and the
methods (plain, static, class, properties) of the classes each module defines, through any
``__wrapped__`` chain (``cute.jit``'s wrapper is the DSL's own code). Each must come from a
library's file (:func:`fa4cache.identity.library_label`) or from fa4cache's own (its
patches are named in the toolchain id: interval masking; the others are routing that does
not change the code generated). A function from anywhere else is a patch, and the caller
keeps every kernel of the process in memory (:mod:`fa4cache.adapters.fa4.compile_cache`).

A replacement that only observes (a counter, a timer) and calls what it replaced may say so
with ``fn.__fa4cache_codegen_neutral__ = True``.

Not seen: values replaced at run time (a module constant), a library function put in
another's place, the methods of the DSL's generated MLIR op classes (``cutlass._mlir.*``: too
many to walk at every process start), and a patch made after the first kernel's key (the
check runs once).
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
import os
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

from fa4cache.identity import library_label

log = logging.getLogger(__name__)

# The packages whose sources the toolchain id digests (fingerprint.py), as module prefixes.
PACKAGES = ("flash_attn.cute", "cutlass", "quack")
_MAX_WRAPPED = 16
# The DSL's generated MLIR op bindings: 45,000 class members, 60% of all (cutlass 4.x), whose
# walk would cost more than the rest together; their module-level functions are checked.
_GENERATED = "cutlass._mlir."


def _own_roots() -> tuple[str, ...]:
    """fa4cache's own code: the folder of each of its imported packages (its wings install
    from folders of their own)."""
    top = __name__.split(".")[0]
    roots = set()
    for name, mod in list(sys.modules.items()):
        if name == top or (name.startswith(top + ".") and hasattr(mod, "__path__")):
            path = getattr(mod, "__file__", None)
            if path:
                roots.add(os.path.realpath(os.path.dirname(path)) + os.sep)
    return tuple(sorted(roots))


_SUBMODULE = tuple(p + "." for p in PACKAGES)


def _in_package(name: str) -> bool:
    return name in PACKAGES or name.startswith(_SUBMODULE)


def _functions(obj: Any) -> list[types.FunctionType]:
    """The Python functions ``obj`` runs as: itself and what it wraps, through ``__wrapped__``,
    ``functools.partial``, static and class methods and properties."""
    out: list[types.FunctionType] = []
    todo = [obj]
    while todo and len(out) < _MAX_WRAPPED:
        obj = todo.pop()
        if type(obj) is types.FunctionType:
            out.append(obj)
            nxt = obj.__dict__.get("__wrapped__") if obj.__dict__ else None
            if nxt is not None and nxt is not obj:
                todo.append(nxt)
        elif isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif isinstance(obj, property):
            todo += [f for f in (obj.fget, obj.fset, obj.fdel) if f is not None]
        elif isinstance(obj, functools.partial):
            todo.append(obj.func)
        elif isinstance(obj, types.FunctionType):
            out.append(obj)
    return out


@functools.lru_cache(maxsize=4096)
def _library_file(filename: str, own: tuple[str, ...]) -> bool:
    """Whether ``filename`` is installed code (a site-packages or dist-packages directory,
    the standard library, a frozen module) or fa4cache's own, not the user's."""
    if filename.startswith("<frozen "):
        return True
    if library_label(filename) is not None:
        return True
    real = os.path.realpath(filename)
    parts = real.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts or real.startswith(own)


# Set to True on a replacement that only observes (counts, logs, times) and calls the function
# it replaced: the user's word that the generated code is the same, as an explicit
# ``__cute_hash__`` is for a mask.
NEUTRAL = "__fa4cache_codegen_neutral__"


def _foreign(fn: types.FunctionType, own: tuple[str, ...]) -> bool:
    if fn.__dict__.get(NEUTRAL) is True:
        return False
    filename = fn.__code__.co_filename
    if filename.startswith("<") and not filename.startswith("<frozen "):
        # Code generated at import (namedtuple and dataclass methods): fine in the package's
        # own classes; anywhere else it is code the user wrote as text.
        module = str(fn.__module__)
        return not (_in_package(module) or module.startswith("namedtuple_"))
    return not _library_file(filename, own)


@dataclass
class _Walked:
    """What one module or class held when it was last walked, and what the walk found in it:
    a later walk that finds it holding the same objects, with the same code and wrappers,
    takes the findings as they were instead of judging every function again."""

    members: dict[str, Any]  # a copy of vars() as walked
    found: list[str]
    fns: list[types.FunctionType]  # every function judged, through wrappers
    marks: tuple[list[Any], ...]  # their code, __wrapped__ and neutral marks as judged (_marks)
    classes: list[tuple[str, type]]  # a module's own classes (walked as containers of their own)


def _marks(fns: list[types.FunctionType]) -> tuple[list[Any], ...]:
    """What the verdict on each function reads besides its identity: its code, ``__wrapped__``
    and neutral mark (in C: no Python frame per function)."""
    return (
        list(map(operator.attrgetter("__code__"), fns)),
        list(map(getattr, fns, itertools.repeat("__wrapped__"), itertools.repeat(None))),
        list(map(getattr, fns, itertools.repeat(NEUTRAL), itertools.repeat(None))),
    )


_SIMPLE = (types.FunctionType, staticmethod, classmethod, property, functools.partial)
_walk_lock = threading.Lock()
_walked: dict[int, tuple[Any, _Walked]] = {}  # id(module or class) -> it, what its walk saw


def _walk(qualname: str, members: dict[str, Any], own: tuple[str, ...], module: str | None) -> _Walked:
    found: list[str] = []
    fns: list[types.FunctionType] = []
    classes: list[tuple[str, type]] = []
    for name, obj in members.items():
        if isinstance(obj, _SIMPLE):
            for fn in _functions(obj):
                fns.append(fn)
                if _foreign(fn, own):
                    found.append(f"{qualname}.{name} ({fn.__code__.co_filename})")
        elif (
            module is not None
            and isinstance(obj, type)
            and obj.__dict__.get("__module__") == module
            and not module.startswith(_GENERATED)
        ):
            classes.append((name, obj))
    return _Walked(members, found, fns, _marks(fns), classes)


def _unchanged(obj: Any, seen: _Walked | None, members: Any) -> bool:
    if seen is None:
        return False
    try:
        same = seen.members == members  # in C, each value by identity first
    except Exception:  # a value whose == raises (an array): judge it again
        return False
    return bool(same) and _marks(seen.fns) == seen.marks


def _container(
    qualname: str, obj: Any, own: tuple[str, ...], module: str | None, live: dict[int, Any]
) -> _Walked:
    members = vars(obj)
    prev = _walked.get(id(obj))
    seen = prev[1] if prev is not None and prev[0] is obj else None
    if not _unchanged(obj, seen, members):
        seen = _walk(qualname, dict(members), own, module)
    assert seen is not None
    live[id(obj)] = (obj, seen)
    return seen


def runtime_patches() -> list[str]:
    """``name (file)`` of each function of the imported FA4, DSL and QuACK modules that comes
    from neither a library's file nor fa4cache's own; empty when none was patched.

    Each module and class is judged again only where it changed since the last call (another
    object in one of its names, a function's code or wrapper replaced): the first call walks
    every function (about a second on a busy host, done in a thread when FA4 is imported,
    :func:`warm_up`), the one at the first kernel's key then costs milliseconds."""
    global _walked
    own = _own_roots()
    found: list[str] = []
    with _walk_lock:
        live: dict[int, Any] = {}
        for mod_name, module in list(sys.modules.items()):
            if module is None or not _in_package(mod_name):
                continue
            try:
                seen = _container(mod_name, module, own, mod_name, live)
            except TypeError:  # an odd module (a lazy proxy, no __dict__): nothing to say about it
                continue
            found += seen.found
            for name, cls in seen.classes:
                found += _container(f"{mod_name}.{name}", cls, own, None, live).found
        _walked = live
    return sorted(set(found))


_lock = threading.Lock()
_found: tuple[str, ...] | None = None
FIX = (
    "make the change in the installed package's files instead (an editable install, or a patch applied "
    "before the job starts: the toolchain id digests those sources, so the changed kernels get keys of "
    "their own), or undo the assignment"
)


def found_once() -> tuple[str, ...]:
    """:func:`runtime_patches`, computed at the first call in this process (the first kernel's
    key) and warned about once; empty when nothing was patched. A check that fails is taken
    as a patch: what cannot be checked is not stored."""
    global _found
    found = _found
    if found is not None:
        return found
    with _lock:
        if _found is not None:
            return _found
        try:
            found = tuple(runtime_patches())
        except Exception as e:  # never the kernel's trouble: its kernels stay in memory
            found = (f"<the check failed: {type(e).__name__}: {e}>",)
        _found = found
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        log.warning(
            "fa4cache: code of FA4, the CUTLASS DSL or QuACK was replaced at run time (%s): its kernels would "
            "differ from what the installed files say, so every kernel of this process is compiled in memory "
            "only, never stored or loaded. Fix: %s.",
            shown,
            FIX,
        )
    return found


def warm_up() -> None:
    """Walk, in a background thread, the functions of the modules imported so far, so that the
    check at the first kernel's key, on a step's critical path, judges only what changed since
    (:func:`runtime_patches`). Called when FA4's interface is imported; the verdict itself is
    still taken at the first key."""
    if _found is not None:
        return  # the verdict is taken (a compile server takes it before it installs): no thread

    def run() -> None:
        try:
            runtime_patches()
        except Exception as e:  # only a warm-up: the check at the first key says what it finds
            log.debug("fa4cache: patch check warm-up: %s", e)

    threading.Thread(target=run, name="fa4cache-patch-check", daemon=True).start()


def forget() -> None:
    """Check again at the next key (a test that undid its patches)."""
    global _found
    with _lock:
        _found = None
