"""Whether the code generators' Python was replaced at run time: FA4, the CUTLASS DSL, QuACK.

The toolchain id digests these packages' *files* (:mod:`fa4cache.fingerprint`); a hot-fix
assigned at run time (``flash_attn.cute.mask.call_mask_mod = my_fix``) changes the kernels
those files describe without changing a byte of them, so a store would serve the unpatched
kernels to patched code and the other way round. :func:`runtime_patches` looks, once, at the
code the imported modules of these packages hold: module-level functions and the methods
(plain, static, class, properties) of the classes each module defines, through whatever
wraps them (``__wrapped__`` chains, as ``cute.jit``'s wrapper and ``lru_cache`` have;
partials and ``partialmethod`` with the functions they pass, ``cached_property``, bound
methods, an instance's ``__call__`` or ``__get__``), and the classes defined inside those
classes. A ``unittest.mock`` object in a module is a patch. Each must come from a library's file (:func:`fa4cache.identity.library_label`)
or from fa4cache's own (its patches are named in the toolchain id: interval masking; the
others are routing that does not change the code generated), and so must each class a
module holds. Code from anywhere else is a patch, and the caller keeps every kernel of the
process in memory (:mod:`fa4cache.adapters.fa4.compile_cache`). A function's attributes are
read as the interpreter reads them (``dict``'s own methods, whatever its ``__dict__`` is).

A replacement that only observes (a counter, a timer) and calls what it replaced may say so
with ``fn.__fa4cache_codegen_neutral__ = True``.

A module whose class is not ``ModuleType`` and a class's bases (its MRO) are judged as
classes are: a subclass of the user's that answers attribute reads, or a base of the user's
whose methods come with it, is a patch.

Not seen: values replaced at run time (a module constant), a partial's keywords changed in
place, text code that names a checked module as its own, a library function put in
another's place, what a wrapper calls through its closure (``__wrapped__`` is followed, not
the closure's cells), an object that a partial passes or an ``lru_cache`` wraps and that ran
no code when it was walked but does later (its class gains ``__call__``, or is assigned one), the methods of the DSL's generated MLIR op classes (``cutlass._mlir.*``: too
many to walk at every process start), and a patch made after the first kernel's key (the
check runs once).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import operator
import os
import sys
import threading
import time
import types
from dataclasses import dataclass
from typing import Any

from fa4cache import dict_versions
from fa4cache.identity import library_label

log = logging.getLogger(__name__)

# The packages whose sources the toolchain id digests (fingerprint.py), as module prefixes.
PACKAGES = ("flash_attn.cute", "cutlass", "quack")
_MAX_WRAPPED = 16
_MAX_NESTED = 4  # classes inside classes, walked this deep
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
    # Only the outermost folders: a subpackage imported later (inside one of them) then leaves
    # the answer as it was, and so every verdict recorded under it (_Walked.own).
    return tuple(r for r in sorted(roots) if not any(r != o and r.startswith(o) for o in roots))


_SUBMODULE = tuple(p + "." for p in PACKAGES)


def _in_package(name: str) -> bool:
    return name in PACKAGES or name.startswith(_SUBMODULE)


def _functions(obj: Any, links: list[tuple[Any, str, Any]] | None = None) -> list[types.FunctionType]:
    """The Python functions ``obj`` runs as: itself and what it wraps, through ``__wrapped__``
    (of a function or an ``lru_cache``), ``functools.partial`` and ``partialmethod`` (and the
    functions they pass), bound, static and class methods, properties, ``cached_property``,
    and the ``__call__`` and ``__get__`` of an instance's class. ``links``: each link followed from an object that is not a
    function is appended as (object, attribute, target) (a function's ``__wrapped__`` is in
    :func:`_marks`). A function's attributes are read as the interpreter reads them (the
    ``dict`` methods, never a subclass's)."""
    out: list[types.FunctionType] = []
    todo = [obj]
    while todo and len(out) < _MAX_WRAPPED:
        obj = todo.pop()
        if type(obj) is types.FunctionType:
            out.append(obj)
            d = obj.__dict__
            nxt = dict.get(d, "__wrapped__") if dict.__len__(d) else None
            if nxt is not None and nxt is not obj:
                todo.append(nxt)
            continue
        if isinstance(obj, (staticmethod, classmethod, types.MethodType)):
            followed = [("__func__", obj.__func__)]
        elif isinstance(obj, property):
            followed = [("fget", obj.fget), ("fset", obj.fset), ("fdel", obj.fdel)]
        elif isinstance(obj, (functools.partial, functools.partialmethod)):
            # and what it passes (a library function handed a user's function runs it)
            followed = [("func", obj.func), ("args", obj.args)]
            todo += [a for a in obj.args if _runs_python(a)]
            todo += [a for a in (obj.keywords or {}).values() if _runs_python(a)]
        elif isinstance(obj, functools.cached_property):
            followed = [("func", obj.func)]
        elif isinstance(obj, _LRU):
            followed = [("__wrapped__", getattr(obj, "__wrapped__", None))]
        elif isinstance(obj, types.FunctionType):
            out.append(obj)
            continue
        else:
            # A callable instance runs its class's __call__, a descriptor its __get__ (the class
            # itself is a link: an instance's __class__ can be assigned).
            klass = type(obj)
            hooks = _class_hooks(klass)
            if not hooks:
                continue
            followed = [("__class__", klass)]
            for name, hook in hooks:
                if links is not None:
                    links.append((klass, name, hook))
                todo.append(hook)
        for attr, target in followed:
            if links is not None:
                links.append((obj, attr, target))
            if target is not None:
                todo.append(target)
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


def _is_text(filename: str) -> bool:
    """Code compiled from text at run time (``<string>``), not from a file or a frozen module."""
    return filename.startswith("<") and not filename.startswith("<frozen ")


def _foreign(fn: types.FunctionType, own: tuple[str, ...]) -> bool:
    if dict.get(fn.__dict__, NEUTRAL) is True:
        return False
    filename = fn.__code__.co_filename
    if _is_text(filename):
        # Code generated at import (namedtuple and dataclass methods): fine in the package's
        # own classes; anywhere else it is code the user wrote as text.
        module = str(fn.__module__)
        return not (_in_package(module) or module.startswith("namedtuple_"))
    return not _library_file(filename, own)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time (a class statement, type())
_IMMUTABLE = (
    1 << 8
)  # Py_TPFLAGS_IMMUTABLETYPE: no attribute of the class, nor any instance's class, can be set


def _foreign_class(klass: type, module: Any, own: tuple[str, ...]) -> bool:
    """Whether ``klass``, named as of ``module`` (the ``__module__`` in its own namespace), was
    defined in the user's code: a module whose file is not a library's, or ``__main__``. A class
    put in a checked module's place holds methods that no walk of that module reaches. A static
    type (built into the interpreter or an extension) runs no Python of its own."""
    if not klass.__flags__ & _HEAPTYPE:
        return False
    if not isinstance(module, str):
        return True
    if _in_package(module) or module in sys.builtin_module_names:
        return False
    if module not in sys.modules:
        return True  # no module to vouch for it
    path = getattr(sys.modules[module], "__file__", None)
    if path is None:
        return module == "__main__" or module.startswith("__")
    return not _library_file(path, own)


@dataclass
class _Walked:
    """What one module or class held when it was last walked, and what the walk found in it:
    a later walk that finds everything the verdict read unchanged takes the findings as they
    were instead of judging every function again. Unchanged is identity throughout, never
    ``==`` (which a value may define to say anything): the same objects under the same names,
    the same links out of static and class methods, properties and partials, each function's
    code, ``__wrapped__``, neutral mark and module, and each class member's ``__module__``."""

    names: list[str]  # vars() as walked: its names, in order,
    values: list[Any]  # and the objects they held
    found: list[str]
    fns: list[types.FunctionType]  # every function judged, through wrappers
    marks: list[Any]  # what the verdict read of each (_marks)
    links: tuple[list[Any], list[str], list[Any]]  # holders, attributes, targets (_functions)
    types_: list[type]  # the classes among the values,
    type_modules: list[Any]  # with their __module__ as walked (which of them are "defined here")
    classes: list[tuple[str, type]]  # a module's own classes (walked as containers of their own)
    own: tuple[str, ...]  # fa4cache's own folders when it was judged (_foreign reads them)
    judged: list[bool]  # per value: a class, or something that runs code (_runs_python)
    value_types: list[type]  # per value: its class (an instance's, a module's can be assigned)
    inert: tuple[type, ...]  # the types of the others, each once (_hooks_appeared)
    frame: Any = None  # what the container is beyond its namespace (_frame), as judged,
    frame_modules: list[Any] = dataclasses.field(default_factory=list)  # and its classes' __module__
    hooked: list[type] = dataclasses.field(default_factory=list)  # classes of callable instances held,
    hook_keys: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)  # with their hooks (_hook_key)


_dict_of = operator.attrgetter("__dict__")
_get_module = operator.methodcaller("get", "__module__")  # of a class's mappingproxy


def _filled(dicts: list[Any]) -> Any:
    # dict's own length and get: a function's __dict__ may be a subclass that answers otherwise
    return map(bool, map(dict.__len__, dicts))


def _gets(dicts: list[Any], name: str) -> Any:
    return map(dict.get, dicts, itertools.repeat(name))


def _marks(fns: list[types.FunctionType]) -> list[Any]:
    """What the verdict on each function reads besides its identity: its code, ``__wrapped__``,
    neutral mark and module (in C: no Python frame per function)."""
    dicts = list(map(_dict_of, fns))  # (a function's attributes live in its __dict__)
    return [
        *map(operator.attrgetter("__code__"), fns),
        *_filled(dicts),  # _functions follows __wrapped__ only from a non-empty __dict__
        *_gets(dicts, "__wrapped__"),
        *_gets(dicts, NEUTRAL),
        *map(operator.attrgetter("__module__"), fns),
    ]


_code_of = operator.attrgetter("__code__")
_module_of = operator.attrgetter("__module__")


def _dress(fns: list[types.FunctionType]) -> list[Any]:
    dicts = list(map(_dict_of, fns))
    return [*_gets(dicts, "__wrapped__"), *_gets(dicts, NEUTRAL)]


def _type_modules(classes: list[type]) -> list[Any]:
    return list(map(_get_module, map(_dict_of, classes)))


def _same(now: Any, then: list[Any]) -> bool:
    """Whether ``now`` holds the objects ``then`` holds, in order (by identity, in C)."""
    return all(map(operator.is_, now, then))


_LRU = type(functools.lru_cache(maxsize=None)(len))
_SIMPLE = (
    types.FunctionType,
    types.MethodType,
    staticmethod,
    classmethod,
    property,
    functools.partial,
    functools.partialmethod,
    functools.cached_property,
    _LRU,
)


_HOOKS = ("__call__", "__get__")


def _class_hooks(klass: type) -> list[tuple[str, types.FunctionType]]:
    """The Python ``__call__`` and ``__get__`` instances of ``klass`` run (a callable, a
    descriptor): each the first found along its MRO, where it is a Python function (a
    metaclass's is what calling the class runs, not an instance)."""
    out = []
    for name in _HOOKS:
        for base in klass.__mro__:
            hook = base.__dict__.get(name)
            if hook is not None:
                if type(hook) is types.FunctionType:
                    out.append((name, hook))
                break
    return out


def _runs_python(obj: Any) -> bool:
    """Whether ``obj`` is something :func:`_functions` follows: a function or wrapper of one,
    or an instance whose class has a Python ``__call__`` or ``__get__`` (never a class: its
    methods are judged where it is defined, or by :func:`_foreign_class`). Where a value runs
    none, its type is kept (:func:`_hooks_appeared`): a class can gain a hook, or new bases."""
    return isinstance(obj, _SIMPLE) or (not isinstance(obj, type) and bool(_class_hooks(type(obj))))


def _hooks_appeared(types_: tuple[type, ...]) -> bool:
    """Whether a type whose instances ran no code now gives them a Python hook."""
    return any(map(_class_hooks, types_))


_MOCKS = ("unittest.mock",)


def _is_mock(value: Any) -> bool:
    """A ``unittest.mock`` object: it runs whatever it was told to (read from the class's own
    namespace: a class made by ``type()`` in text code may have no ``__module__``)."""
    return type(value).__dict__.get("__module__") in _MOCKS


def _needs_judging(value: Any) -> bool:
    """Whether a value that takes another's place must be judged: a class, something that
    runs Python, a mock."""
    return isinstance(value, type) or _runs_python(value) or _is_mock(value)


def _hook_key(klass: type) -> tuple[Any, ...]:
    """The Python ``__call__`` and ``__get__`` a class gives its instances, names and functions
    laid flat (compared with ``==``: strings and plain functions, which compare by identity)."""
    return tuple(x for pair in _class_hooks(klass) for x in pair)


def _frame_classes(frame: Any) -> tuple[type, ...]:
    """The classes a container's frame brings in (:func:`_frame`): a class's bases, or a
    module's class where it is not ``ModuleType`` itself."""
    if isinstance(frame, tuple):
        return frame[1:]
    return () if frame is types.ModuleType else (frame,)


_walk_lock = threading.Lock()
# (id(module or class), the module name it was walked under) -> it, what its walk saw. The
# name is part of the key: one module object listed under two names (cutlass.cuda is
# cutlass.base_dsl.runtime.cuda) has other classes "defined here" under each.
_walked: dict[tuple[int, str | None], tuple[Any, _Walked]] = {}


def _traverse(values: list[Any]) -> tuple[list[types.FunctionType], list[tuple[Any, str, Any]], list[int]]:
    """Every function the members run as, the links followed to them, and for each function
    the index of the member it came from."""
    fns: list[types.FunctionType] = []
    links: list[tuple[Any, str, Any]] = []
    owner: list[int] = []
    for i, obj in enumerate(values):
        if _runs_python(obj):
            got = _functions(obj, links)
            fns += got
            owner += [i] * len(got)
    return fns, links, owner


def _walk(
    qualname: str, members: Any, own: tuple[str, ...], module: str | None, outer: type | None = None
) -> tuple[_Walked, bool]:
    """Judge the functions of one module or class; the record of what was judged, and whether
    nothing the verdict read changed while it was judged (another thread patching meanwhile):
    only then is the record kept, else the next call walks it again."""
    items = list(members.items())  # one read: names and objects from the same moment
    names, values = [n for n, _ in items], [v for _, v in items]
    fns, links, owner = _traverse(values)
    marks = _marks(fns)
    found = [
        f"{qualname}.{names[i]} ({fn.__code__.co_filename})" for fn, i in zip(fns, owner) if _foreign(fn, own)
    ]
    classes_ = [v for v in values if isinstance(v, type)]
    type_modules = _type_modules(classes_)
    found += [
        f"{qualname}.{n} (a class of {m!r})"
        for n, v in zip(names, values)
        if isinstance(v, type) and _foreign_class(v, m := v.__dict__.get("__module__"), own)
    ]
    # A mock put in a library's place (unittest.mock.patch) runs whatever it was told to.
    found += [
        f"{qualname}.{n} (a {type(v).__name__} of unittest.mock)"
        for n, v in zip(names, values)
        if _is_mock(v)
    ]
    if module is not None and not module.startswith(_GENERATED):
        classes = [
            (n, v)
            for n, v in zip(names, values)
            if isinstance(v, type) and v.__dict__.get("__module__") == module
        ]
    elif outer is not None and not str(outer.__module__).startswith(_GENERATED):
        # classes defined inside this one (FA4's tile schedulers' Params)
        inner = f"{outer.__qualname__}."
        classes = [
            (n, v)
            for n, v in zip(names, values)
            if isinstance(v, type)
            and v.__dict__.get("__module__") == outer.__module__
            and getattr(v, "__qualname__", None) == inner + n
        ]
    else:
        classes = []
    judged = [isinstance(v, type) or _runs_python(v) for v in values]
    inert = tuple({id(t): t for t in (type(v) for v, j in zip(values, judged) if not j)}.values())
    fns2, links2, _ = _traverse(values)
    stable = (
        len(fns2) == len(fns)
        and _same(fns2, fns)
        and _same(_marks(fns), marks)
        and len(links2) == len(links)
        and all(a is b for x, y in zip(links2, links) for a, b in zip(x, y))
        and _same(_type_modules(classes_), type_modules)
    )
    holders, attrs, targets = (list(t) for t in zip(*links)) if links else ([], [], [])
    links_ = (holders, attrs, targets)
    hooked = list({id(t): t for _, a, t in links if a == "__class__"}.values())
    walked = _Walked(
        names,
        values,
        found,
        fns,
        marks,
        links_,
        classes_,
        type_modules,
        classes,
        own,
        judged,
        list(map(type, values)),
        inert,
    )
    walked.hooked, walked.hook_keys = hooked, list(map(_hook_key, hooked))
    return walked, stable and not _hooks_appeared(inert)


_MRO = type.__dict__["__mro__"].__get__  # (type's own: a metaclass cannot answer otherwise)


def _frame(obj: Any) -> Any:
    """What a module or class is beyond its namespace: a module's class (a subclass of
    ``ModuleType`` answers attribute reads with code of its own), a class's MRO (its bases
    bring their methods). Compared by identity: a new ``__bases__`` makes a new MRO."""
    return _MRO(obj) if isinstance(obj, type) else type(obj)


def _frame_found(qualname: str, obj: Any, frame: Any, own: tuple[str, ...]) -> list[str]:
    """The classes of the user's that ``frame`` brings in: a module's class, a class's bases."""
    what, classes = ("a base" if isinstance(obj, type) else "its class"), _frame_classes(frame)
    return [
        f"{qualname} ({what} {getattr(k, '__qualname__', k)} of {m!r})"
        for k in classes
        if _foreign_class(k, m := vars(k).get("__module__"), own)
    ]


def _unchanged(seen: _Walked | None, members: Any, own: tuple[str, ...], frame: Any = None) -> bool:
    if seen is None:
        return False
    holders, attrs, targets = seen.links
    return (
        seen.own == own
        and seen.frame is frame
        and _same(_type_modules(list(_frame_classes(frame))), seen.frame_modules)
        and list(map(_hook_key, seen.hooked)) == seen.hook_keys
        and list(members) == seen.names
        and _same(members.values(), seen.values)
        and _same(map(type, seen.values), seen.value_types)
        and _same(_marks(seen.fns), seen.marks)
        and _same(map(getattr, holders, attrs), targets)
        and _same(_type_modules(seen.types_), seen.type_modules)
        and not _hooks_appeared(seen.inert)
    )


def _container(
    qualname: str,
    obj: Any,
    own: tuple[str, ...],
    module: str | None,
    live: dict[Any, Any],
    outer: type | None = None,
) -> tuple[_Walked, str]:
    """The record of ``obj`` and how it was had: ``"kept"`` (unchanged since the last walk),
    ``"walked"`` (judged now, kept for the next call) or ``"unstable"`` (judged now, but a change
    landed while it was judged: not kept, the next call walks it again)."""
    frame = _frame(obj)
    members = vars(obj)
    key = (id(obj), module)
    prev = _walked.get(key)
    seen = prev[1] if prev is not None and prev[0] is obj else None
    how = "kept"
    if not _unchanged(seen, members, own, frame):
        seen, stable = _walk(qualname, members, own, module, outer)
        seen.frame = frame
        seen.frame_modules = _type_modules(list(_frame_classes(frame)))
        seen.found += _frame_found(qualname, obj, frame, own)
        if not stable or _frame(obj) is not frame:
            return seen, "unstable"
        how = "walked"
    assert seen is not None
    live[key] = (obj, seen)
    return seen, how


_PACKAGE_NAMES = frozenset(PACKAGES)


def _checked_modules(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The imported modules of the checked packages among ``items`` (``sys.modules``' (name,
    module) pairs), in order (no Python call per module)."""
    return [(n, m) for n, m in items if n in _PACKAGE_NAMES or n.startswith(_SUBMODULE)]


def _same_pairs(now: list[tuple[str, Any]], then: list[tuple[str, Any]]) -> bool:
    return (
        len(now) == len(then)
        and [n for n, _ in now] == [n for n, _ in then]
        and _same([m for _, m in now], [m for _, m in then])
    )


def _same_modules(now: list[tuple[str, Any]], then: dict[str, Any]) -> bool:
    return len(now) == len(then) and all(then.get(n, _ABSENT) is m for n, m in now)


_ABSENT = object()
_values_of = operator.methodcaller("values")


def _picker(indices: list[int]) -> Any:
    """``list -> tuple`` of the items at ``indices`` (in C; any number of them)."""
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    return lambda items: tuple(items[i] for i in indices)


@dataclass(frozen=True)
class _Snapshot:
    """Every record of one whole walk whose containers were all kept, laid end to end: the
    check at a kernel's key then asks, in a few passes in C over all of them at once, what
    :func:`_unchanged` asks of each (the same names, objects, marks, links and class modules),
    and takes the walk's findings when all hold. Valid only while the checked packages'
    modules and fa4cache's own folders are the ones it was taken with."""

    imported: list[tuple[str, Any]]  # sys.modules as it was (unchanged: so are the next two)
    checked: dict[str, Any]  # name -> module (in any order: an import moves its module to the end)
    own: tuple[str, ...]  # fa4cache's own folders (_own_roots)
    containers: list[Any]
    sizes: list[int]  # how many names each container held
    names: list[str]
    value_types: list[type]  # the type of every value,
    pick: Any  # (an itemgetter of the judged ones among them: functions, wrappers, classes)
    inert: tuple[type, ...]  # the types of the others (each once): none may gain a hook
    judged: tuple[Any, ...]  # and the judged ones themselves: a flag or a table the modules
    # update as they run (cutlass's trace switches, FA4's caches) is no patch, and must not
    # cost the first key a walk
    fns: list[types.FunctionType]
    codes: list[Any]  # each function's code, and whether its __dict__ held anything, as walked
    filled: list[bool]
    dressed: list[types.FunctionType]  # those whose __dict__ held something,
    dress: list[Any]  # with their __wrapped__ and neutral mark as walked
    texts: list[types.FunctionType]  # those whose code is text (its __module__ decides),
    text_modules: list[Any]  # with their __module__ as walked
    holders: list[Any]
    attrs: list[str]
    targets: list[Any]
    types_: list[type]
    type_modules: list[Any]
    found: list[str]
    # For the check by version tags (_Tags): every value, where each container's start, which
    # were judged, and the values whose class can be assigned (with their types as walked)
    values: list[Any]
    offsets: list[int]
    judged_at: list[bool]
    mutable: list[Any]
    mutable_types: list[type]
    frames: list[Any]  # each container's _frame, as judged
    hooked: list[type]  # the classes of the callable instances held,
    hook_keys: list[tuple[Any, ...]]  # with the hooks they gave them (_hook_key)
    tags: _Tags | None = None

    @classmethod
    def of(
        cls,
        imported: list[tuple[str, Any]],
        checked: list[tuple[str, Any]],
        own: tuple[str, ...],
        records: list[tuple[Any, _Walked]],
        found: list[str],
    ) -> _Snapshot | None:
        """None where two records saw one class under two modules (it changed mid-walk)."""
        walked = [w for _, w in records]
        values = [v for w in walked for v in w.values]
        judged = list(itertools.compress(range(len(values)), (j for w in walked for j in w.judged)))
        agree = True  # every record saw each class under one __module__, each function alike
        fns: list[types.FunctionType] = []
        marks: list[list[Any]] = [[] for _ in range(5)]  # as _marks lays them out, per function
        at: dict[int, int] = {}  # each function once (a module re-exports another's)
        for w in walked:
            n = len(w.fns)
            for k, fn in enumerate(w.fns):
                got = [w.marks[g * n + k] for g in range(5)]
                i = at.setdefault(id(fn), len(fns))
                if i == len(fns):
                    fns.append(fn)
                    for g in range(5):
                        marks[g].append(got[g])
                elif any(marks[g][i] is not got[g] for g in range(5)):
                    agree = False  # (it changed between two records' walks)
        codes, filled, wrapped, neutral, modules = marks
        # What _foreign reads beyond the code: a __dict__'s marks only where it held anything
        # (an empty one that fills flips `filled`), a __module__ only for text code (a change of
        # code, which decides that, is seen in `codes`).
        dressed = [i for i, f in enumerate(filled) if f]
        texts = [i for i, c in enumerate(codes) if _is_text(c.co_filename)]
        # The classes held, and those the containers' frames bring in (bases, a module's class):
        # each one's __module__ as its record judged it.
        judged_classes = [
            (t, m)
            for w in walked
            for t, m in itertools.chain(
                zip(w.types_, w.type_modules), zip(_frame_classes(w.frame), w.frame_modules)
            )
        ]
        classes = list({id(t): t for t, _ in judged_classes}.values())
        first: dict[int, Any] = {}
        for t, m in judged_classes:
            if first.setdefault(id(t), m) is not m:
                agree = False  # (another thread set it between two records' walks)
        hooked: dict[int, tuple[type, tuple[Any, ...]]] = {}
        for w in walked:
            for k, key in zip(w.hooked, w.hook_keys):
                if hooked.setdefault(id(k), (k, key))[1] != key:
                    agree = False
        if not agree:
            return None
        offsets = list(itertools.accumulate((len(w.names) for w in walked), initial=0))[:-1]
        mutable = [v for v in values if _class_assignable(v)]
        return cls(
            imported=imported,
            checked=dict(checked),
            own=own,
            containers=[obj for obj, _ in records],
            sizes=[len(w.names) for w in walked],
            names=[n for w in walked for n in w.names],
            value_types=list(map(type, values)),
            pick=_picker(judged),
            judged=tuple(values[i] for i in judged),
            inert=tuple({id(t): t for w in walked for t in w.inert}.values()),
            fns=fns,
            codes=codes,
            filled=filled,
            dressed=[fns[i] for i in dressed],
            dress=[wrapped[i] for i in dressed] + [neutral[i] for i in dressed],
            texts=[fns[i] for i in texts],
            text_modules=[modules[i] for i in texts],
            holders=[h for w in walked for h in w.links[0]],
            attrs=[a for w in walked for a in w.links[1]],
            targets=[t for w in walked for t in w.links[2]],
            types_=classes,  # each class once (a module imports the same ones as the next)
            type_modules=[first[id(t)] for t in classes],
            found=found,
            values=values,
            offsets=offsets,
            judged_at=[j for w in walked for j in w.judged],
            mutable=mutable,
            mutable_types=list(map(type, mutable)),
            frames=[w.frame for w in walked],
            hooked=[k for k, _ in hooked.values()],
            hook_keys=[key for _, key in hooked.values()],
        )

    def changed(self, imported: list[tuple[str, Any]]) -> tuple[str | None, list[tuple[str, Any]]]:
        """What no longer holds (logged at debug level: each costs the first key a check record
        by record), or None where the snapshot vouches for every record; and the checked
        modules imported since, which it cannot vouch for (they are judged on their own)."""
        added: list[tuple[str, Any]] = []
        if not _same_pairs(imported, self.imported):  # something imported since: the modules that count
            now = _checked_modules(imported)
            if not _same_modules(now, self.checked):
                then = self.checked
                kept = [(n, m) for n, m in now if n in then]
                if len(kept) != len(then) or not all(then[n] is m for n, m in kept):
                    return "a checked module removed or replaced", []
                added = [(n, m) for n, m in now if n not in then]
            if _own_roots() != self.own:
                return "fa4cache's own folders", []
        if self.tags is not None:
            return self._changed_by_tags(self.tags), added
        return self._changed_by_contents(), added

    def _changed_by_contents(self) -> str | None:
        """What no longer holds, from what every module and class holds now."""
        members = list(map(vars, self.containers))
        sizes = list(map(len, members))
        if sizes == self.sizes:
            names, values = members, list(map(_values_of, members))
        else:
            # A namespace that only grew by values that run no code (a submodule imported since
            # sets its name on its package) keeps what it held, in order, first.
            if not all(map(operator.ge, sizes, self.sizes)):
                return "a name removed from a module or class"
            grew = [i for i, (n, m) in enumerate(zip(sizes, self.sizes)) if n != m]
            new = [v for i in grew for v in itertools.islice(members[i].values(), self.sizes[i], None)]
            if any(map(_needs_judging, new)):
                return "a function, wrapper or class added to a module or class"
            names = list(map(itertools.islice, members, self.sizes))
            values = list(map(itertools.islice, map(_values_of, members), self.sizes))
        if list(itertools.chain.from_iterable(names)) != self.names:
            return "a module's or class's names"
        flat = list(itertools.chain.from_iterable(values))
        checks = (
            ("a value that runs code", lambda: self._still_inert(flat)),
            ("a class that gained a __call__ or __get__", lambda: not _hooks_appeared(self.inert)),
            ("a function, wrapper or class held", lambda: _same(self.pick(flat), self.judged)),
            *self._object_checks(),
            ("a class's module", lambda: _same(_type_modules(self.types_), self.type_modules)),
        )
        return next((what for what, holds in checks if not holds()), None)

    def _changed_by_tags(self, tags: _Tags) -> str | None:
        """What no longer holds, reading only the namespaces whose version tag moved: the
        others hold the same objects under the same names (and their classes the same
        ``__module__``). What no namespace holds is looked at as in the other way: the
        functions, the wrappers' links, the classes' hooks, and the class of each value whose
        class can be assigned."""
        now = tags.read(tags.addresses)
        if now != tags.tags:
            moved = [i for i, (a, b) in enumerate(zip(now, tags.tags)) if a != b]
            for i in moved:
                for c in tags.containers[i]:
                    what = self._container_changed(c)
                    if what is not None:
                        return what
                for k in tags.classes[i]:
                    if vars(self.types_[k]).get("__module__") is not self.type_modules[k]:
                        return "a class's module"
        checks = (
            ("a value's class", lambda: _same(map(type, self.mutable), self.mutable_types)),
            ("a class that gained a __call__ or __get__", lambda: not _hooks_appeared(self.inert)),
            *self._object_checks(),
        )
        return next((what for what, holds in checks if not holds()), None)

    def _container_changed(self, c: int) -> str | None:
        """What no longer holds in container ``c``, whose namespace changed: the same names
        first, and each object held where one was judged; a value that is not code may change
        (a flag, a table), and names may be added for such values."""
        items = list(vars(self.containers[c]).items())  # one read: names and objects together
        off, n = self.offsets[c], self.sizes[c]
        if len(items) < n:
            return "a name removed from a module or class"
        if [k for k, _ in items[:n]] != self.names[off : off + n]:
            return "a module's or class's names"
        if any(_needs_judging(v) for _, v in items[n:]):
            return "a function, wrapper or class added to a module or class"
        then = zip(self.values[off : off + n], self.judged_at[off : off + n])
        for (_, v), (was, judged) in zip(items, then):
            if v is not was and (judged or _needs_judging(v)):
                return "a function, wrapper or class held"
        return None

    def _object_checks(self) -> tuple[tuple[str, Any], ...]:
        return (
            ("a module's class or a class's bases", lambda: _same(map(_frame, self.containers), self.frames)),
            (
                "a callable instance's class's hooks",
                lambda: list(map(_hook_key, self.hooked)) == self.hook_keys,
            ),
            ("a function's code", lambda: _same(map(_code_of, self.fns), self.codes)),
            ("a function's attributes", lambda: _same(_filled(list(map(_dict_of, self.fns))), self.filled)),
            ("a function's __wrapped__ or mark", lambda: _same(_dress(self.dressed), self.dress)),
            ("text code's module", lambda: _same(map(_module_of, self.texts), self.text_modules)),
            ("a wrapper's link", lambda: _same(map(getattr, self.holders, self.attrs), self.targets)),
        )

    def tagged(self) -> _Snapshot:
        """This snapshot with the version tags of every namespace it read (the modules', its
        classes') where this interpreter's tags can be trusted (:mod:`fa4cache.dict_versions`),
        read before the snapshot is checked against what they hold now: a change after the
        read moves a tag. As it was where it does not hold now, or a namespace has no tag."""
        read = dict_versions.reader()
        if read is None:
            return self
        at: dict[int, int] = {}
        dicts: list[dict[Any, Any]] = []
        containers: list[list[int]] = []
        classes: list[list[int]] = []

        def slot(d: dict[Any, Any]) -> int:
            i = at.setdefault(id(d), len(dicts))
            if i == len(dicts):
                dicts.append(d)
                containers.append([])
                classes.append([])
            return i

        for c, obj in enumerate(self.containers):
            d = dict_versions.namespace(obj)
            if d is None:
                return self
            containers[slot(d)].append(c)
        for k, klass in enumerate(self.types_):
            d = dict_versions.namespace(klass)
            if d is None:
                return self
            classes[slot(d)].append(k)
        where = dict_versions.addresses(dicts)
        tags = read(where)
        if self._changed_by_contents() is not None:
            return self
        now = self._as_held_now()
        if now is None:
            return self
        return dataclasses.replace(now, tags=_Tags(read, dicts, where, tags, containers, classes))

    def _as_held_now(self) -> _Snapshot | None:
        """This snapshot with every value as the namespaces hold it now, read after the tags
        and after the check that nothing which runs code changed since the walk: a value that
        changed, or was added, in the meantime (a flag set, a submodule's name on its package)
        is the one whose class and type a later check must look at, since its namespace's tag
        will not move again. None where something changed that would need judging."""
        items = [list(vars(c).items()) for c in self.containers]  # one read each
        sizes = list(map(len, items))
        if not all(map(operator.ge, sizes, self.sizes)):
            return None
        names = [k for it in items for k, _ in it]
        values = [v for it in items for _, v in it]
        judged_at: list[bool] = []
        for it, off, n in zip(items, self.offsets, self.sizes):
            if [k for k, _ in it[:n]] != self.names[off : off + n]:
                return None
            for j, (_, v) in enumerate(it):
                if j < n and v is self.values[off + j]:
                    judged = self.judged_at[off + j]
                    if not judged and type(v) is not self.value_types[off + j] and _runs_python(v):
                        return None  # (its class was assigned one that runs code)
                    judged_at.append(judged)
                elif (j < n and self.judged_at[off + j]) or _needs_judging(v):
                    return None  # (changed after the check: judged again at the next call)
                else:
                    judged_at.append(False)
        inert = tuple({id(type(v)): type(v) for v, j in zip(values, judged_at) if not j}.values())
        if _hooks_appeared(inert):
            return None  # (a class whose instances ran no code gained a hook)
        judged = list(itertools.compress(range(len(values)), judged_at))
        mutable = [v for v in values if _class_assignable(v)]
        return dataclasses.replace(
            self,
            sizes=sizes,
            names=names,
            value_types=list(map(type, values)),
            pick=_picker(judged),
            judged=tuple(values[i] for i in judged),
            inert=inert,
            values=values,
            offsets=list(itertools.accumulate(sizes, initial=0))[:-1],
            judged_at=judged_at,
            mutable=mutable,
            mutable_types=list(map(type, mutable)),
        )

    def _still_inert(self, values: list[Any]) -> bool:
        """Whether every value that was not judged still needs no judging: the same type (one
        pass in C), or, only where a type changed (a flag from None to a bool), nothing that
        runs Python."""
        if _same(map(type, values), self.value_types):
            return True
        moved = map(operator.is_not, map(type, values), self.value_types)  # (picked in C, then judged)
        return not any(map(_needs_judging, itertools.compress(values, moved)))


@dataclass(frozen=True)
class _Tags:
    """The version tags of the namespaces a snapshot read, as they were when it held."""

    read: Any  # dicts -> their tags (dict_versions.reader())
    dicts: list[dict[Any, Any]]  # each namespace once (a module's dict, a class's behind its proxy;
    # held, so that each lives while its address is read)
    addresses: list[int]  # where its tag lies,
    tags: list[int]  # its tag,
    containers: list[list[int]]  # the snapshot's containers it is the namespace of,
    classes: list[list[int]]  # and the classes of types_ whose __module__ it holds


def _class_assignable(value: Any) -> bool:
    """Whether ``value.__class__`` can be assigned: an instance of a mutable class, or a module
    (whose class may become a subclass of ``ModuleType``)."""
    return not type(value).__flags__ & _IMMUTABLE or isinstance(value, types.ModuleType)


_snapshot: _Snapshot | None = None


def runtime_patches(*, snapshot: bool = False) -> list[str]:
    """``name (file)`` of each function of the imported FA4, DSL and QuACK modules that comes
    from neither a library's file nor fa4cache's own; empty when none was patched.

    Each module and class is judged again only where something the verdict read changed since
    the last call (:class:`_Walked`): the first call walks every function (about a second on a
    busy host, done in a thread when FA4 is imported, :func:`warm_up`); the one at the first
    kernel's key, when nothing changed, compares the warm-up's records with what the modules
    hold now in a few passes over all of them (:class:`_Snapshot`: milliseconds), reading only
    the namespaces whose version tag moved where the tags can be trusted (:mod:`fa4cache.dict_versions`).

    ``snapshot``: take a new snapshot of this walk's records (tens of milliseconds: the warm-up
    and a compile server's first walk, off any step's path)."""
    global _walked, _snapshot
    with _walk_lock:
        imported = list(sys.modules.items())
        snap = _snapshot
        if snap is not None:
            what, added = snap.changed(imported)
            if what is None:
                # The snapshot vouches for its records; a checked module imported since is
                # judged on its own (its records join the others for a later call).
                live: dict[Any, Any] = {}
                found = list(snap.found) + _judge(added, snap.own, live, [])[0]
                _walked.update(live)
                return sorted(set(found))
            log.debug("fa4cache: patch check: changed since the snapshot: %s", what)
        _snapshot = None
        checked = _checked_modules(imported)
        own = _own_roots()
        live = {}
        records: list[tuple[Any, _Walked]] = []  # in walk order, each name of a module its own
        found, whole = _judge(checked, own, live, records)
        _walked = live
        found = sorted(set(found))
        if whole and snapshot:
            taken = _Snapshot.of(imported, checked, own, records, found)
            _snapshot = taken.tagged() if taken is not None else None
    return found


def _judge(
    modules: list[tuple[str, Any]],
    own: tuple[str, ...],
    live: dict[Any, Any],
    records: list[tuple[Any, _Walked]],
) -> tuple[list[str], bool]:
    """Judge ``modules`` and the classes each defines (:func:`_container`): what was found,
    and whether every record was kept (a snapshot can vouch for them); each record is added to
    ``live`` and, in walk order, to ``records``."""
    found: list[str] = []
    whole = True
    for mod_name, module in modules:
        try:
            vars(module)
        except TypeError:  # an odd module (a lazy proxy, no __dict__): nothing to say about it
            whole = False
            continue
        seen, how = _container(mod_name, module, own, mod_name, live)  # what raises fails the check
        records.append((module, seen))
        whole = whole and how != "unstable"
        found += seen.found
        todo = [(f"{mod_name}.{name}", cls, 0) for name, cls in seen.classes]
        while todo:
            qualname, cls, depth = todo.pop(0)
            member, how = _container(qualname, cls, own, None, live, cls)
            records.append((cls, member))
            whole = whole and how != "unstable"
            found += member.found
            if depth < _MAX_NESTED:
                todo += [(f"{qualname}.{name}", inner, depth + 1) for name, inner in member.classes]
    return found, whole


_lock = threading.Lock()
_found: tuple[str, ...] | None = None
_warming = False  # a warm-up thread was started (one per process)
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
            "only, never stored or loaded%s. Fix: %s.",
            shown,
            ""
            if _checking()
            else " from now on (FA4CACHE_PATCH_CHECK=0: what it loaded before trusted the files)",
            FIX,
        )
    return found


_said_off = False


def found_for_loads() -> tuple[str, ...]:
    """What decides whether this process may *load* kernels from the store: :func:`found_once`,
    or, with ``FA4CACHE_PATCH_CHECK=0``, nothing (the user's word that the installed files say
    what runs: the first key waits for no check). A publish always asks :func:`found_once`, by
    then off the step's path (after a compile of seconds): a patched process never stores a
    kernel that other processes would load."""
    global _said_off
    if _checking() or _found is not None:  # (a verdict taken for a publish counts for loads too)
        return found_once()
    if not _said_off:
        _said_off = True
        log.info(
            "fa4cache: run-time patch check off for loads (FA4CACHE_PATCH_CHECK=0): the installed files are trusted"
        )
    return ()


def warm_up() -> None:
    """Walk, in a background thread, the functions of the modules imported so far, so that the
    check at the first kernel's key, on a step's critical path, judges only what changed since
    (:func:`runtime_patches`). Called when FA4's interface is imported; the verdict itself is
    still taken at the first key."""
    global _warming
    with _lock:
        if _found is not None or _warming or not _checking():
            # the verdict is taken (a compile server takes it before it installs), or warming,
            # or loads skip it (FA4CACHE_PATCH_CHECK=0: only a publish walks, after a compile)
            return
        _warming = True

    def run() -> None:
        try:
            _settled()
            runtime_patches(snapshot=True)
        except Exception as e:  # only a warm-up: the check at the first key says what it finds
            log.debug("fa4cache: patch check warm-up: %s", e)

    threading.Thread(target=run, name="fa4cache-patch-check", daemon=True).start()


def _checking() -> bool:
    from fa4cache.settings import setting

    return bool(setting("FA4CACHE_PATCH_CHECK"))


def _settled(timeout: float = 10.0) -> None:
    """Wait (up to ``timeout`` s) until no checked module is still being imported: the warm-up
    starts inside FA4's import, and a package whose ``__init__`` is still running fills its
    namespace after a snapshot taken now (which the first key would then find changed)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(
        getattr(getattr(m, "__spec__", None), "_initializing", False)
        for _, m in _checked_modules(list(sys.modules.items()))
    ):
        time.sleep(0.01)


def _after_fork_in_child() -> None:
    """A child forked while another thread walked (a warm-up) would wait on that thread's lock
    forever: fresh locks, and the child walks for itself."""
    global _walk_lock, _lock, _walked, _warming, _snapshot
    _walk_lock, _lock = threading.Lock(), threading.Lock()
    _walked, _warming, _snapshot = {}, False, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forget() -> None:
    """Check again at the next key (a test that undid its patches)."""
    global _found
    with _lock:
        _found = None
