"""Code identity: a digest over everything a user function's generated kernel can depend on.

A ``mask_mod``, a ``score_mod`` or a ``@jit_cache`` function is traced by the CuTe DSL:
the kernel it becomes depends on its own code and on everything it reads while being
traced. A persistent key must cover all of that, or a later run loads a kernel built for
other code (the failure FA4's in-process ``hash_callable`` -- source text plus ``repr`` of
closure cells -- turns into once kernels outlive the process). The walker is an allow-list:
:func:`identity` values, by content,

* the code object of the function and of every function it reaches, transitively,
  wherever it is defined: through globals, closure cells, defaults, attribute chains
  (``helpers.offset``), bound methods, ``functools.partial`` and user classes (bases and
  members). Code, not source text (its syntax-tree node, :func:`code_text` without a
  file): two lambdas on one line differ, comments, docstrings and formatting do not count,
  and line numbers do not reach a kernel's bytes (measured);
* the *values* of the globals, attribute chains (``cfg.WIDTH``), closure cells and
  defaults it reads, encoded by value, never by ``repr``;
* library code by name only where the toolchain id covers it: the code generators'
  distributions (FA4, the CUTLASS DSL, QuACK) and tvm-ffi; of the rest, only pure
  standard-library functions (``math``, ``operator``) and pure builtins. Nothing is
  judged by a name prefix: ``torchtitan`` is user code.

Everything else raises :class:`~fa4cache.errors.UnkeyableCode` naming the name and the
fix, and callers keep the kernel in memory only: an arbitrary object, a tensor, a user
module used as a whole, a source file edited since it was imported, any other library's
function or state (``os.environ``, ``sys.modules``, ``open``, frames), a memoising wrapper,
a class computing its attributes (``__getattr__``), a container subclass with state.

An :class:`Identity` remembers what it read, so :meth:`Identity.valid` can tell cheaply
whether any of it changed since (a module constant set at run time, a function
redefined); :func:`current_digest` recomputes then. No digest outlives what it covers.
"""

from __future__ import annotations

import ast
import collections
import dis
import enum
import functools
import hashlib
import inspect
import linecache
import os
import sys
import sysconfig
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from .errors import UnkeyableCode, UnstableKeyError
from .fingerprint import CODEGEN_DISTRIBUTIONS, DISTRIBUTIONS
from .hashing import encode_key

IDENTITY_FORMAT = "fa4cache-identity-v2"
# A compile key holding a string with this prefix names code no key describes completely:
# it is compiled and kept in memory, never stored, fetched or shipped.
MEMORY_ONLY = "fa4cache-memory-only:"
MAX_FUNCTIONS = 256
_MAX_DEPTH = 24
_PY = f"cp{sys.version_info.major}{sys.version_info.minor}"
_MISSING = object()
_FIX = (
    "make it a constant (number, string, tuple, enum, frozen dataclass), pass it to the kernel as "
    "an aux tensor, or give it an explicit key: obj.__fa4cache_key__ = '<a string that changes "
    "whenever what it means does>' (for a mask_mod or score_mod itself: fn.__cute_hash__ = '...')"
)

# Library code: the files of these distributions. The key versions the code generators
# (fingerprint.CODEGEN_DISTRIBUTIONS); every library label below also carries its
# distribution's version, so torch or tvm-ffi code a kernel reaches is versioned too.
LIBRARY_DISTRIBUTIONS = DISTRIBUTIONS + ("nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13")


# --------------------------------------------------------------------------- where code lives


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[tuple[str, str], ...]:
    """(directory prefix, ``dist==version``) of every top-level package or module the library
    distributions install, longest first. Read from their RECORDs: no import."""
    from importlib import metadata

    roots: dict[str, str] = {}
    for name in LIBRARY_DISTRIBUTIONS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        label = f"{name}=={dist.version}"
        tops: set[str] = set()
        for f in dist.files or ():
            parts = f.parts
            if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] in ("..", "bin"):
                continue
            if len(parts) == 1:
                if parts[0].endswith(".py"):
                    tops.add(parts[0])  # a top-level module
                continue
            # flash_attn is shared with FlashAttention 2: FA4 owns only its own subpackages.
            tops.add("/".join(parts[:2]) if parts[0] == "flash_attn" and len(parts) > 2 else parts[0])
        for top in tops:
            path = os.path.realpath(str(dist.locate_file(top)))
            roots[path if top.endswith(".py") else path + os.sep] = label
    return tuple(sorted(roots.items(), key=lambda kv: -len(kv[0])))


@functools.lru_cache(maxsize=1)
def _stdlib_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    out = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k)}
    site = {os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib") if paths.get(k)}
    return tuple(sorted(out - site))


@functools.lru_cache(maxsize=4096)
def library_label(filename: str) -> str | None:
    """``dist==version`` of the library distribution a file belongs to, ``stdlib-cpXY`` for
    the standard library, None for user code."""
    if not filename or filename.startswith("<"):
        return None
    real = os.path.realpath(filename)
    for prefix, label in _library_roots():
        if real == prefix or real.startswith(prefix):
            return label
    for prefix in _stdlib_roots():
        if real.startswith(prefix) and "site-packages" not in real[len(prefix) :]:
            return f"stdlib-{_PY}"
    return None


def _module_file(name: str | None) -> str:
    mod = sys.modules.get(name or "")
    return getattr(mod, "__file__", None) or ""


def _library_of_module(module: types.ModuleType) -> str | None:
    if module.__name__ in sys.builtin_module_names:
        return f"builtin-{_PY}"
    return library_label(getattr(module, "__file__", None) or "")


def is_library_code(obj: Any) -> bool:
    """Whether ``obj`` (a function, or any object by its class) is a library's (versioned by
    the fingerprint), not the user's."""
    if isinstance(obj, types.FunctionType):
        return library_label(obj.__code__.co_filename) is not None
    return _library_of_class(type(obj)) is not None


def library_class(cls: type) -> bool:
    """Whether the class ``cls`` is a library's (builtins, the standard library, a library
    distribution), not the user's."""
    return _library_of_class(cls) is not None


def _library_of_class(cls: type) -> str | None:
    if cls.__module__ == "builtins":
        return "builtins"
    return library_label(_module_file(cls.__module__)) or (
        f"builtin-{_PY}" if cls.__module__ in sys.builtin_module_names else None
    )


# --------------------------------------------------------------------------- what a key may stand on

# Library code a key may name instead of valuing: the code generators' own distributions,
# whose sources the toolchain id digests (FA4, the CUTLASS DSL, QuACK), and tvm-ffi.
_TRUSTED_DISTRIBUTIONS = frozenset(
    CODEGEN_DISTRIBUTIONS + ("nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13", "apache-tvm-ffi")
)
# Standard-library modules whose functions compute from their arguments only.
_PURE_MODULES = frozenset({"math", "cmath", "operator", "_operator", "itertools"})
# ... and single functions of other standard-library modules that do.
_PURE_FUNCTIONS = frozenset(
    {
        "functools.update_wrapper", "functools.wraps", "functools.reduce", "functools.cmp_to_key",
        "dataclasses.field", "dataclasses.fields", "dataclasses.replace", "dataclasses.astuple",
        "dataclasses.asdict", "dataclasses.is_dataclass", "typing.cast",
    }
)  # fmt: skip
# Standard-library modules whose classes are plain data or typing helpers.
_PLAIN_CLASS_MODULES = _PURE_MODULES | frozenset(
    {"builtins", "enum", "dataclasses", "typing", "collections", "functools"}
)
# Builtins that compute from their arguments only. Not here: open, input, id, hash (salted
# per process), globals/vars/locals/eval/exec/compile/__import__ (a lookup by string), dir,
# setattr/delattr, breakpoint, help.
_PURE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "classmethod", "complex",
        "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "getattr", "hasattr",
        "hex", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next",
        "object", "oct", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set",
        "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "zip",
        "NotImplemented", "Ellipsis", "None", "True", "False",
    }
)  # fmt: skip
_LIBRARY_FIX = (
    "read the value in your own code into a module constant (or pass it to the kernel as an "
    "argument or aux tensor), or give the mask an explicit key: fn.__cute_hash__ = '<a string that "
    "changes whenever what it means does>'"
)


def _trusted(label: str | None) -> bool:
    return label is not None and label.split("==", 1)[0] in _TRUSTED_DISTRIBUTIONS


def _pure_builtin(name: str, obj: Any) -> bool:
    return name in _PURE_BUILTINS or (isinstance(obj, type) and issubclass(obj, BaseException))


def _module_allowed(module: types.ModuleType) -> bool:
    """Whether a library module may be named rather than valued: a code generator's, or a
    pure standard-library one (math, operator)."""
    return module.__name__ in _PURE_MODULES or _trusted(_library_of_module(module))


def own_attr(obj: Any, name: str) -> Any:
    """``obj``'s own attribute ``name`` (its ``__dict__``, else its class's), read without
    ``__getattr__`` (a delegating wrapper answers with its delegate's). An attribute that
    ``functools.wraps`` copied from the function a user's wrapper wraps is not its own: None."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        d = None
    if isinstance(d, dict) and name in d:
        value = d[name]
    else:
        value = inspect.getattr_static(obj, name, None)
        if isinstance(value, (property, types.FunctionType, staticmethod, classmethod)):
            return None
    wrapped = d.get("__wrapped__") if isinstance(d, dict) else None
    copied = wrapped is not None and wrapped is not obj and not is_library_code(obj)
    if value is not None and copied and own_attr(wrapped, name) is value:
        return None
    return value


# --------------------------------------------------------------------------- sources


@functools.lru_cache(maxsize=256)
def _compiled_file(filename: str, stamp: tuple[int, int]) -> frozenset[tuple[Any, ...]]:
    """:func:`_code_sig` of every code object of ``filename`` as it is on disk now."""
    lines = linecache.getlines(filename)
    try:
        top = compile("".join(lines), filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return frozenset()
    out: set[tuple[Any, ...]] = set()
    todo = [top]
    while todo:
        c = todo.pop()
        out.add(_code_sig(c))
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return frozenset(out)


def _stamp(filename: str) -> tuple[int, int] | None:
    try:
        st = os.stat(filename)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def source_code(fn: types.FunctionType) -> types.CodeType:
    """The code ``fn`` was compiled to from its source. The CuTe DSL rewrites a ``@cute.jit``
    function's ``__code__`` when it first traces it (its AST preprocessor) and keeps the
    original as ``_original_code``: that one is what the source says."""
    original = getattr(fn, "_original_code", None)
    return original if isinstance(original, types.CodeType) else fn.__code__


def function_code(fn: types.FunctionType) -> str:
    """What the trace of ``fn`` depends on: its syntax tree (:func:`_ast_text`) when its
    file holds it, else its code object (:func:`code_text`), checked against its file first. A file edited since its module was imported no longer
    describes the code that runs, and the CuTe DSL re-reads a ``@cute.jit`` function's
    source to rewrite it: such code is unkeyable until reloaded."""
    code = source_code(fn)
    filename = code.co_filename
    stamp = _stamp(filename)
    if stamp is not None:
        linecache.checkcache(filename)
        if _code_sig(code) not in _compiled_file(filename, stamp):
            raise UnkeyableCode(
                f"the source of {fn.__module__}.{fn.__qualname__} ({filename}) changed on disk since it was "
                "imported, so it does not describe the code that runs",
                name=f"{fn.__module__}.{fn.__qualname__}",
                fix="restart the process (or reload the module) after editing it",
            )
    node = _ast_node(code) if stamp is not None else None
    text = _ast_text(code, node) if node is not None else code_text(code)
    if os.environ.get("CUTE_DSL_LINEINFO", "").strip().lower() not in ("", "0", "false", "off", "no"):
        # The DSL's --lineinfo build puts file and line numbers into the kernel's bytes.
        text += f":lineinfo:{filename}:{code.co_firstlineno}:{code.co_linetable.hex()}"
    return text


@functools.lru_cache(maxsize=64)
def _parsed(filename: str, stamp: tuple[int, int]) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(filename)), filename)
    except (SyntaxError, ValueError):
        return None


def _ast_node(code: types.CodeType) -> ast.AST | None:
    """The function's own node in its (unchanged) file's syntax tree: the ``def`` with its
    name on its first line, or the lambda whose body holds the code's positions (two lambdas
    on one line are two nodes). None when it is not exactly one."""
    stamp = _stamp(code.co_filename)
    tree = _parsed(code.co_filename, stamp) if stamp is not None else None
    if tree is None:
        return None
    first = code.co_firstlineno
    if code.co_name == "<lambda>":
        positions = code.co_positions() if hasattr(code, "co_positions") else ()  # 3.11+
        spans = [(a, c, b, d) for a, b, c, d in positions if None not in (a, b, c, d) and (a, c) != (b, d)]
        found = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Lambda)
            and n.lineno == first
            and all(
                (a, c) >= (n.body.lineno, n.body.col_offset)
                and (b, d) <= (n.body.end_lineno or 0, n.body.end_col_offset or 0)
                for a, c, b, d in spans
            )
        ]
    else:
        found = [
            n
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name == code.co_name
            and (n.decorator_list[0].lineno if n.decorator_list else n.lineno) == first
        ]
    return found[0] if len(found) == 1 else None


def _ast_text(code: types.CodeType, node: ast.AST) -> str:
    """A function as its syntax tree says (what the CuTe DSL rewrites for a ``cute.jit``
    function, and what its bytecode is compiled from): no comments, docstrings, formatting
    or positions, and no Python version (bytecode is Python's own, the tree is the
    language's). Fields a Python version adds empty (``type_params``) are left out."""

    def dump(n: Any) -> str:
        if isinstance(n, ast.AST):
            parts = []
            for f in n._fields:
                v = getattr(n, f, None)
                if f == "body" and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and v:
                    first = v[0]
                    value = first.value if isinstance(first, ast.Expr) else None
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        v = v[1:]  # the docstring
                if v is None or v == [] or (f == "kind" and isinstance(n, ast.Constant)):
                    continue
                parts.append(f"{f}={dump(v)}")
            return f"{type(n).__name__}({','.join(parts)})"
        if isinstance(n, list):
            return "[" + ",".join(dump(x) for x in n) + "]"
        if isinstance(n, float):
            return f"float:{n.hex()}"
        return repr(n)

    return f"ast:{code.co_name}:{dump(node)}"


def code_text(code: types.CodeType) -> str:
    """A code object as the trace sees it: bytecode, constants (nested code objects by their
    own text), the names it reads, parameter names and counts, flags. Not its source text:
    two lambdas on one line are two codes, while comments, docstrings, formatting and line
    numbers (which do not reach the kernel's bytes: measured, see docs/store.md) are not
    in it. Bytecode is Python's own: the text names the Python version."""
    return repr(
        (
            _PY,
            code.co_name,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_flags,
            code.co_code.hex(),
            code.co_exceptiontable.hex() if hasattr(code, "co_exceptiontable") else "",
            [_const_text(c, code_text) for c in _consts_without_doc(code)],
            code.co_names,
            code.co_varnames,
            code.co_freevars,
            code.co_cellvars,
        )
    )


def _consts_without_doc(code: types.CodeType) -> list[Any]:
    """``co_consts`` with a docstring left out: the first constant, when no instruction loads
    it, is the docstring or the None that stands in for one (3.11)."""
    consts = list(code.co_consts)
    if (
        consts
        and (consts[0] is None or isinstance(consts[0], str))
        and not any(op.opcode in dis.hasconst and op.arg == 0 for op in dis.get_instructions(code))
    ):
        consts[0] = "<doc>"
    return consts


def _code_sig(code: types.CodeType) -> tuple[Any, ...]:
    # Bytecode alone misses a changed constant (return 1 / return 2 share it), and a swap of
    # parameters (def off(a, b): a - b -> def off(b, a): b - a) shares bytecode and constants.
    return (
        code.co_name,
        code.co_firstlineno,
        code.co_code,
        _consts_text(code),
        code.co_names,
        code.co_varnames,
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
    )


def _consts_text(code: types.CodeType) -> str:
    # Nested code (an inner mask_mod, a lambda) by its own signature: edited inside, it differs.
    return repr([_const_text(c, _code_sig) for c in code.co_consts])


def _const_text(c: Any, of_code: Callable[[types.CodeType], Any]) -> Any:
    if isinstance(c, types.CodeType):
        return of_code(c)
    if isinstance(c, frozenset):  # `x in {...}`: its repr's order follows the hash seed
        return ("frozenset", sorted(repr(x) for x in c))
    if isinstance(c, float):  # -0.0 and 0.0, nan: repr tells them apart, == does not
        return ("float", c.hex())
    return c


# --------------------------------------------------------------------------- what code reads

_LOAD_GLOBAL = {"LOAD_GLOBAL", "LOAD_NAME"}
# Builtins that read variables by a string (globals()["OFF"]): what they read is no read above.
_LOOKUPS_BY_STRING = frozenset({"globals", "vars", "locals", "eval", "exec", "__import__"})
_LOAD_FREE = {"LOAD_DEREF", "LOAD_CLASSDEREF"}
_ATTR = {"LOAD_ATTR", "LOAD_METHOD"}


@dataclass(frozen=True)
class _Read:
    scope: str  # "global" or "free"
    name: str
    attrs: tuple[str, ...]  # () : the name itself is used (passed, called, indexed)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def reads(code: types.CodeType, freevars: Iterable[str]) -> set[_Read]:
    """Globals and closure variables ``code`` (nested code included) reads, each with the
    attribute chain read from it (``cfg.WIDTH`` -> ``("WIDTH",)``). Where a name is used
    otherwise too, the bare name is a read of its own: then its whole value matters."""
    free = set(freevars)
    out: set[_Read] = set()
    for c in _codes(code):
        ins = list(dis.get_instructions(c))
        for i, op in enumerate(ins):
            if op.opname in _LOAD_GLOBAL:
                scope = "global"
            elif op.opname in _LOAD_FREE and op.argval in free:
                scope = "free"
            else:
                continue
            attrs: list[str] = []
            j = i + 1
            while j < len(ins) and ins[j].opname in _ATTR and isinstance(ins[j].argval, str):
                attrs.append(ins[j].argval)
                j += 1
            out.add(_Read(scope, str(op.argval), tuple(attrs)))
        for op in ins:
            if op.opname == "IMPORT_NAME":
                out.add(_Read("import", str(op.argval), ()))
    return out


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class _Check:
    """One thing the digest read: ``get()`` must still give the same object (``same``) or,
    for a mutable value, the same text."""

    get: Callable[[], Any]
    expected: Any
    text: str | None = None


@dataclass(frozen=True)
class Identity:
    """A function's code identity: ``digest``, and the reads that made it."""

    digest: str
    checks: tuple[_Check, ...]

    def valid(self) -> bool:
        """Whether everything the digest read is unchanged (cheap: identity checks, and a
        re-encoding only of mutable values). On jit_cache's hot path: one loop, no calls
        beyond each read's own getter."""
        for c in self.checks:
            try:
                now = c.get()
            except Exception:
                return False
            if now is not c.expected:
                return False
            if c.text is not None and _value_text(now) != c.text:
                return False
        return True


def _get_item(mapping: dict[str, Any], name: str) -> Callable[[], Any]:
    return lambda: mapping.get(name, _MISSING)


def _get_attr(obj: Any, name: str) -> Callable[[], Any]:
    return lambda: getattr(obj, name, _MISSING)


def _get_cell(cell: Any) -> Callable[[], Any]:
    def get() -> Any:
        try:
            return cell.cell_contents
        except ValueError:
            return _MISSING

    return get


def _same_members(now: Any, snapshot: dict[str, Any]) -> bool:
    return len(now) == len(snapshot) and all(now.get(k, _MISSING) is v for k, v in snapshot.items())


def _is_mutable(value: Any) -> bool:
    """Whether ``value`` can change without being replaced (its text is re-checked then)."""
    if isinstance(value, (list, dict, set, bytearray, functools.partial)):
        return True
    if isinstance(value, tuple):  # ([5],): the list inside can change
        return any(_is_mutable(x) for x in value)
    if isinstance(value, types.MethodType):
        return _is_mutable(value.__self__)
    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
        return False  # (a callable object's attributes can change: mask.k = 6)
    if is_dataclass(value) and not isinstance(value, type):
        frozen = type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
        return not frozen or any(_is_mutable(getattr(value, f.name)) for f in fields(value))
    return isinstance(getattr(value, "__dict__", None), dict)


def _refuse_attribute_hooks(cls: type, what: str) -> None:
    """A user class that computes its attributes (``__getattr__`` delegation) answers reads
    with values no chain follows: refused."""
    for klass in cls.__mro__:
        if klass is object or _library_of_class(klass) is not None:
            continue
        for hook in ("__getattr__", "__getattribute__"):
            if hook in vars(klass):
                raise UnkeyableCode(
                    f"{what}: {klass.__module__}.{klass.__qualname__} computes its attributes in {hook}, "
                    "so what a read returns is not a value fa4cache can follow",
                    name=f"{klass.__qualname__}.{hook}",
                    fix="store the values as attributes (or read the delegate directly)",
                )


class _Walker:
    def __init__(self, *, record: bool = True) -> None:
        self.record = record  # False: a re-encoding for a check, which records nothing itself
        self.h = hashlib.sha256(f"{IDENTITY_FORMAT}\0".encode())
        self.checks: list[_Check] = []
        self.check_keys: set[tuple[Any, ...]] = set()
        self.seen: dict[int, Any] = {}  # id -> object, kept alive so ids are not reused
        self.todo: list[tuple[types.FunctionType, str]] = []
        self.count = 0

    def feed(self, *parts: str) -> None:
        for p in parts:
            self.h.update(p.encode())
            self.h.update(b"\0")

    def check(
        self,
        get: Callable[[], Any],
        expected: Any,
        *,
        by_value: bool = True,
        key: tuple[Any, ...] | None = None,
    ) -> None:
        """Record a read; ``by_value``: a mutable value is re-encoded at each check (an object
        a chain only passes through is checked by identity: the chain's end is checked too).
        ``key``: the same read made by several functions is checked once."""
        if not self.record:
            return
        if key is not None:
            key = (*key, by_value)
            if key in self.check_keys:
                return
            self.check_keys.add(key)
        text = None
        if by_value and _is_mutable(expected):
            try:
                text = _value_text(expected)
            except UnkeyableCode:
                pass  # valuing it for the key raises next, naming where it was read
        self.checks.append(_Check(get, expected, text))

    # -- values -------------------------------------------------------------------
    def value(self, v: Any, where: str, depth: int, *, root: bool = False) -> str:
        if depth > _MAX_DEPTH:
            raise UnkeyableCode(f"{where} nests deeper than {_MAX_DEPTH} levels", name=where, fix=_FIX)
        if v is None or type(v) in (bool, int, float, str):  # an IntEnum member is an enum
            return encode_key(v)
        if isinstance(v, bytes):
            return "bytes:" + v.hex()
        explicit = None if root else _explicit_key(v)  # the root is what an explicit key is made of
        if explicit is not None:
            return explicit
        if isinstance(v, enum.Enum):
            return f"enum:{self.value(type(v), where, depth + 1)}.{v.name}"
        if isinstance(v, (int, float, str)):  # a subclass (class MyInt(int)): its class and value
            if getattr(v, "__dict__", None):
                raise UnkeyableCode(
                    f"{where} is a {type(v).__qualname__} with state beside its value",
                    name=where,
                    fix="keep the values in a frozen dataclass",
                )
            plain = int(v) if isinstance(v, int) else float(v) if isinstance(v, float) else str(v)
            return f"{self.value(type(v), where, depth + 1)}:{encode_key(plain)}"
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            inner = ",".join(self.value(x, f"{where}.{f}", depth + 1) for f, x in zip(v._fields, v))
            return f"nt:{self.value(type(v), where, depth + 1)}({inner})"
        if isinstance(v, (tuple, list)):
            inner = ",".join(self.value(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
            return f"{type(v).__name__}{self.subclass(v, where, depth)}:[{inner}]"
        if isinstance(v, (set, frozenset)):
            return f"set:[{','.join(sorted(self.value(x, where + '{}', depth + 1) for x in v))}]"
        if isinstance(v, dict):
            items = sorted(
                f"{self.value(k, where + '.key', depth + 1)}={self.value(x, f'{where}[{k!r}]', depth + 1)}"
                for k, x in v.items()
            )
            factory = getattr(v, "default_factory", None) if isinstance(v, collections.defaultdict) else None
            if factory is not None:
                items.append(f"default_factory={self.value(factory, where + '.default_factory', depth + 1)}")
            return f"dict{self.subclass(v, where, depth)}:{{{','.join(items)}}}"
        if isinstance(v, type):
            return self.klass(v, where)
        if isinstance(v, types.ModuleType):
            label = _library_of_module(v)
            if label is None:
                raise UnkeyableCode(
                    f"{where} is the user module {v.__name__}, used as a whole: fa4cache cannot tell "
                    "which of its names the code reads",
                    name=where,
                    fix=f"read its names directly ({v.__name__}.NAME) or import them by name",
                )
            if not _module_allowed(v):
                raise UnkeyableCode(
                    f"{where} is the library module {v.__name__}, used as a whole: what the code reads "
                    "through it is library state fa4cache cannot prove",
                    name=where,
                    fix=_LIBRARY_FIX,
                )
            return f"module:{label}:{v.__name__}"
        if isinstance(v, types.FunctionType):
            return self.function_ref(v, where)
        if isinstance(v, types.MethodType):
            return f"method:{self.value(v.__self__, where + '.__self__', depth + 1)}.{self.value(v.__func__, where, depth + 1)}"
        if isinstance(v, functools.partial):
            return (
                f"partial:{self.value(v.func, where + '.func', depth + 1)}"
                f"({self.value(v.args, where + '.args', depth + 1)};{self.value(v.keywords, where + '.keywords', depth + 1)})"
            )
        if isinstance(v, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            owner = getattr(v, "__self__", None)
            if owner is None or isinstance(owner, types.ModuleType):
                mod = getattr(v, "__module__", None) or getattr(owner, "__name__", None) or ""
                module = sys.modules.get(mod)
                if not (
                    mod in _PURE_MODULES
                    or f"{mod}.{v.__qualname__}" in _PURE_FUNCTIONS
                    or (mod == "builtins" and _pure_builtin(v.__name__, v))
                    or (module is not None and mod != "builtins" and _trusted(_library_of_module(module)))
                ):
                    raise UnkeyableCode(
                        f"{where} is the builtin {mod}.{v.__qualname__}, whose result fa4cache cannot prove",
                        name=where,
                        fix=_LIBRARY_FIX,
                    )
                return f"builtin:{mod}.{v.__qualname__}"
            if isinstance(owner, type) and owner.__module__ == "builtins":
                return f"builtin:builtins.{owner.__qualname__}.{v.__name__}"  # object.__new__ (an Enum's)
        if isinstance(v, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            # dict.__getitem__, object.__setattr__: a builtin type's own method, by name.
            owner = v.__objclass__
            if owner.__module__ == "builtins":
                return f"builtin:builtins.{v.__qualname__}"
        tmod, tname = type(v).__module__, type(v).__qualname__
        if tmod == "torch" and tname in ("dtype", "device"):
            return f"torch.{tname}:{v}"
        wrapped = getattr(v, "__wrapped__", None)
        if wrapped is not None and hasattr(v, "cache_info"):
            raise UnkeyableCode(
                f"{where} is a memoising wrapper ({tmod}.{tname}): its results come from a cache the key "
                "cannot see, filled under earlier values",
                name=where,
                fix="call the function itself, not a cached wrapper of it",
            )
        if isinstance(wrapped, types.FunctionType) and _trusted(_library_of_class(type(v))):
            # A library's wrapper object (cute.jit's): what it wraps counts. A user's wrapper
            # class is an object like any other below: its attributes count too.
            return f"wrapped:{self.value(type(v), where, depth + 1)}:{self.function_ref(wrapped, where)}"
        if is_dataclass(v):
            names = [f.name for f in fields(v)]
            # Attributes set beside the fields (CFG.extra = 5) count too: a method reads them.
            names += sorted(k for k in getattr(v, "__dict__", {}) if k not in names)
            inner = ",".join(f"{n}={self.value(getattr(v, n), f'{where}.{n}', depth + 1)}" for n in names)
            return f"dataclass:{self.klass(type(v), where)}({inner})"
        label = _library_of_class(type(v))
        state = getattr(v, "__dict__", None)
        if label is None and isinstance(state, dict) and not hasattr(type(v), "__slots__"):
            # A config object, a kernel object, a bound method's self: its class's code and
            # its attributes are all that it is.
            inner = ",".join(
                f"{k}={self.value(x, f'{where}.{k}', depth + 1)}" for k, x in sorted(state.items())
            )
            return f"object:{self.klass(type(v), where)}({inner})"
        if label is not None and tmod.split(".")[0] in ("cutlass", "tvm_ffi") and " at 0x" not in repr(v):
            # The DSL's numeric constants (cutlass.Int32(4)) print their value.
            return f"libvalue:{label}:{tmod}.{tname}:{v!r}"
        if tmod.startswith("torch") and tname in ("Tensor", "Parameter"):
            raise UnkeyableCode(
                f"{where} is a tensor: its values are not part of any key",
                name=where,
                fix="pass it to the kernel as an aux tensor",
            )
        raise UnkeyableCode(
            f"{where} is a {tmod}.{tname}, which fa4cache cannot key by value", name=where, fix=_FIX
        )

    def subclass(self, v: Any, where: str, depth: int) -> str:
        """A container of a subclass (its own __getitem__, __missing__): the class counts.
        One that keeps state beside its items (self.w = 64 read by a method) is refused."""
        if type(v) in (tuple, list, dict):
            return ""
        state = getattr(v, "__dict__", None)
        slots = any("__slots__" in vars(k) and vars(k)["__slots__"] for k in type(v).__mro__[:-1]
                    if _library_of_class(k) is None)  # fmt: skip
        if state or slots:
            raise UnkeyableCode(
                f"{where} is a {type(v).__qualname__} (a {type(v).__mro__[-2].__name__} subclass) with "
                "state beside its items, which fa4cache does not follow",
                name=where,
                fix="keep the values in a frozen dataclass or a plain dict",
            )
        return "<" + self.value(type(v), where, depth + 1) + ">"

    def klass(self, cls: type, where: str) -> str:
        label = _library_of_class(cls)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if label is not None:
            if not (
                _trusted(label)
                or cls.__module__.split(".")[0] in _PLAIN_CLASS_MODULES
                or (cls.__module__ == "torch" and cls.__name__ in ("dtype", "device"))
            ):
                raise UnkeyableCode(
                    f"{where} is the library class {name}, outside the code generators': what its "
                    "objects compute is not proven by any key",
                    name=where,
                    fix=_LIBRARY_FIX,
                )
            return f"type:{label}:{name}"
        if id(cls) in self.seen:
            return f"class:{name}"
        self.seen[id(cls)] = cls
        # Not its source text (a comment is no change): its bases, and every member below.
        self.feed("class", name, "bases", ",".join(f"{k.__module__}.{k.__qualname__}" for k in cls.__mro__))
        if is_dataclass(cls):
            self.feed("fields", ",".join(f.name for f in fields(cls)))
        _refuse_attribute_hooks(cls, f"{where} (class {name})")
        for klass in cls.__mro__:
            if klass is object or _library_of_class(klass) is not None:
                continue
            snapshot = dict(vars(klass))
            # By identity, not ==: X = 1 -> 1.0 or True is equal, and traces another type.
            self.check(lambda k=klass, snap=snapshot: _same_members(vars(k), snap) or _MISSING, True)
            for attr, member in sorted(snapshot.items()):
                if not attr.startswith("__") and _is_mutable(member):  # Cls.OFFS[0] = 4: in place
                    self.check(_get_attr(klass, attr), member)
                text = self.member(member, f"{name}.{attr}", generated_ok=is_dataclass(klass))
                if text is not None:
                    self.feed("attr", klass.__qualname__, attr, text)
        meta = type(cls)
        if meta is not type and _library_of_class(meta) is None:  # type(self).OFF on a metaclass
            self.feed("metaclass", self.klass(meta, f"type({name})"))
        return f"class:{name}"

    def member(self, member: Any, where: str, *, generated_ok: bool = False) -> str | None:
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            return ",".join(self.member(a, where) or "-" for a in (member.fget, member.fset, member.fdel))
        if isinstance(member, types.FunctionType):
            label = library_label(member.__code__.co_filename)
            if label is not None and not _trusted(label) and member.__module__ in _PLAIN_CLASS_MODULES:
                # Class machinery a plain-data base put in the class (an Enum's __new__): named.
                return f"lib:{label}:{member.__module__}.{member.__qualname__}"
            inner = member  # a dataclass's __repr__ comes wrapped by reprlib.recursive_repr
            while isinstance(getattr(inner, "__wrapped__", None), types.FunctionType) and library_label(
                inner.__code__.co_filename
            ):
                inner = inner.__wrapped__
            generated = inner.__code__.co_filename.startswith("<") and inner.__name__.startswith("__")
            if generated and generated_ok:
                return None  # a dataclass's __init__, __eq__: the class source covers it
            return self.function_ref(member, where)
        if where.rsplit(".", 1)[-1].startswith("__"):
            return None  # __dict__, __weakref__, __dataclass_fields__, __doc__: not read by kernels
        # A method may read it through self (self.H.OFF), which no chain follows: a value
        # no key can hold makes the class unkeyable, as a global would.
        return self.value(member, where, 1)

    # -- functions ----------------------------------------------------------------
    def function_ref(self, fn: types.FunctionType, where: str) -> str:
        label = library_label(fn.__code__.co_filename)
        name = f"{fn.__module__}.{fn.__qualname__}"
        if label is not None:
            if not (_trusted(label) or fn.__module__ in _PURE_MODULES or name in _PURE_FUNCTIONS):
                raise UnkeyableCode(
                    f"{where} is {name}, a library function outside the code generators' (FA4, the "
                    "CUTLASS DSL, QuACK): fa4cache cannot prove what its result depends on",
                    name=where,
                    fix=_LIBRARY_FIX,
                )
            wrapped = getattr(fn, "__wrapped__", None)
            if wrapped is not None and wrapped is not fn:  # cute.jit, functools.wraps: what it wraps counts
                return f"lib:{label}:{name}>{self.value(wrapped, where, 1)}"
            # The fingerprint covers library *code*; what a library closure captured
            # (FA4's create_softcap_scoremod(softcap)) is a value like any other.
            state = self.function_state(fn, name)
            return f"lib:{label}:{name}{state}"
        if id(fn) not in self.seen:
            self.seen[id(fn)] = fn
            self.todo.append((fn, where))
        return f"fn:{name}"

    def function_state(self, fn: types.FunctionType, name: str) -> str:
        """A library function's captured values: closure cells and defaults, by value."""
        parts = []
        for attr in ("__defaults__", "__kwdefaults__"):
            d = getattr(fn, attr)
            self.check(_get_attr(fn, attr), d)  # replaced, or edited in place (__kwdefaults__["off"])
            if d is not None:
                parts.append(f"{attr}={self.value(d, f'{attr} of {name}', 1)}")
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            get = _get_cell(cell)
            v = get()
            self.check(get, v)
            if v is not _MISSING:
                parts.append(f"{var}={self.value(v, f'{var} (captured by {name})', 1)}")
        return f"({';'.join(parts)})" if parts else ""

    def function(self, fn: types.FunctionType) -> None:
        self.count += 1
        name = f"{fn.__module__}.{fn.__qualname__}"
        if self.count > MAX_FUNCTIONS:
            raise UnkeyableCode(
                f"{name} is one of more than {MAX_FUNCTIONS} functions reached", name=name, fix=_FIX
            )
        code = source_code(fn)
        self.check(lambda: source_code(fn), code)
        self.feed("function", name, function_code(fn))
        for attr in ("__defaults__", "__kwdefaults__"):
            d = getattr(fn, attr)
            self.check(_get_attr(fn, attr), d)  # replaced, or edited in place (__kwdefaults__["off"])
            if d is not None:
                self.feed(attr, self.value(d, f"{attr} of {name}", 1))
        cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
        for r in sorted(reads(code, code.co_freevars), key=lambda r: (r.scope, r.name, r.attrs)):
            self.read(fn, name, r, cells)

    def read(self, fn: types.FunctionType, name: str, r: _Read, cells: dict[str, Any]) -> None:
        where = ".".join((r.name, *r.attrs))
        if r.scope == "import":
            mod = sys.modules.get(r.name)
            if mod is None or _library_of_module(mod) is None:
                raise UnkeyableCode(
                    f"{name} imports {r.name} inside its body", name=r.name, fix="import it at module level"
                )
            self.feed("import", r.name, str(_library_of_module(mod)))
            return
        if r.scope == "global":
            g = fn.__globals__
            get = _get_item(g, r.name)
            base = g.get(r.name, _MISSING)
            if base is _MISSING:
                builtins = g.get("__builtins__", {})
                builtins = vars(builtins) if isinstance(builtins, types.ModuleType) else builtins
                self.check(get, _MISSING, key=("g", id(g), r.name))
                if r.name not in builtins:
                    self.feed("undefined", r.name)  # a NameError at trace time, as in any run
                    return
                if r.name in _LOOKUPS_BY_STRING:
                    raise UnkeyableCode(
                        f"{name} calls {r.name}(): the names it looks up by string are not visible to fa4cache",
                        name=name,
                        fix="read the values by name (NAME, module.NAME) instead",
                    )
                if not _pure_builtin(r.name, builtins[r.name]):
                    raise UnkeyableCode(
                        f"{name} calls the builtin {r.name}(), whose result fa4cache cannot prove (a file, "
                        "the process's state)",
                        name=r.name,
                        fix=_LIBRARY_FIX,
                    )
                base, get = builtins[r.name], _get_item(builtins, r.name)
                g = builtins
            where_key: tuple[Any, ...] = ("g", id(g), r.name)
        else:
            cell = cells[r.name]
            get = _get_cell(cell)
            base = get()
            where_key = ("c", id(cell))
        self.check(get, base, by_value=not r.attrs, key=where_key)
        obj, library_owner, untrusted = base, None, None
        for i, attr in enumerate(r.attrs):
            if isinstance(obj, types.ModuleType):
                if _library_of_module(obj) is not None:
                    library_owner = library_owner or obj
                    if untrusted is None and not _module_allowed(obj):
                        untrusted = obj
                elif attr not in vars(obj) and callable(vars(obj).get("__getattr__")):
                    raise UnkeyableCode(
                        f"{name} reads {where}, which the module {obj.__name__} computes in its __getattr__",
                        name=where,
                        fix="define the value in the module",
                    )
            elif not isinstance(obj, type) and _library_of_class(type(obj)) is None:
                _refuse_attribute_hooks(type(obj), f"{name} reads {where}")
            nxt = getattr(obj, attr, _MISSING)
            # Library modules too: a value kept on one (torch.some_setting = 128) can change
            # under a running kernel like any other.
            self.check(_get_attr(obj, attr), nxt, by_value=i == len(r.attrs) - 1, key=("a", id(obj), attr))
            obj = nxt
            if nxt is _MISSING:
                break  # an AttributeError at trace time, as in any run
        if untrusted is not None and obj is not _MISSING and _is_mutable(obj):
            # os.environ, sys.modules: the library's state, read through it at trace time.
            raise UnkeyableCode(
                f"{name} reads {where} through the library module {untrusted.__name__}: state fa4cache cannot prove",
                name=where,
                fix=_LIBRARY_FIX,
            )
        try:
            text = self.value(obj, where, 1) if obj is not _MISSING else "missing"
        except UnkeyableCode as e:
            if library_owner is None or untrusted is not None or not _trusted(_library_of_class(type(obj))):
                raise UnkeyableCode(f"{e.reason}, read by {name}", name=e.name, fix=e.fix) from None
            # A code generator's own object without a value encoding (cute.struct): the
            # toolchain id digests its sources, and the check above sees it replaced.
            text = f"libattr:{_library_of_module(library_owner)}"
        self.feed("read", r.scope, r.name, ".".join(r.attrs), text)

    def run(self, fn: Any, extra: tuple[str, ...]) -> Identity:
        # The root itself, re-encoded at each check where it can change in place (a mask
        # object's attribute, a partial's keywords, a bound method's self).
        self.check(lambda: fn, fn)
        self.feed("root", self.value(fn, _name_of(fn), 0, root=True))
        while self.todo:
            f, _ = self.todo.pop(0)
            self.function(f)
        for e in extra:
            self.feed("extra", e)
        return Identity(self.h.hexdigest(), tuple(self.checks))


def _value_text(value: Any) -> str:
    """A mutable value's text, to compare at a re-check: a fresh walker, so that re-encoding
    follows and records nothing."""
    return _Walker(record=False).value(value, "value", 0)


def _name_of(fn: Any) -> str:
    # Read statically: a __getattr__ wrapper would answer with its delegate's name.
    module = inspect.getattr_static(fn, "__module__", "?")
    qualname = inspect.getattr_static(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        qualname = type(fn).__qualname__
    return f"{module if isinstance(module, str) else '?'}.{qualname}"


def _explicit_key(v: Any) -> str | None:
    """A user's own key: ``__fa4cache_key__`` (a string), or an fa4cache mask's live identity."""
    live = fa4cache_identity(v)
    if live is not None:
        return "mask:" + str(live())
    key = own_attr(v, "__fa4cache_key__")
    if isinstance(key, str):
        return "explicit:" + key
    return None


def fa4cache_identity(v: Any) -> Callable[[], str] | None:
    """The live identity fa4cache itself gave ``v`` (a mask template's mask): a partial bound
    to ``v`` itself. One a wrapper copied (functools.wraps) or answers through __getattr__
    is its inner mask's, not its own: None."""
    live = own_attr(v, "__fa4cache_identity__")
    if isinstance(live, functools.partial) and live.args and live.args[0] is v:
        return live
    return None


def value_identity(value: Any, where: str) -> Identity:
    """The identity of a value passed to generated code (a ``@jit_cache`` argument): by
    content, classes and callables walked like globals. Raises :class:`UnkeyableCode`."""
    w = _Walker()
    try:
        w.feed("value", w.value(value, where, 0))
        while w.todo:
            f, _ = w.todo.pop(0)
            w.function(f)
    except UnstableKeyError as e:
        if isinstance(e, UnkeyableCode):
            raise
        raise UnkeyableCode(str(e), name=where, fix=_FIX) from None
    return Identity(w.h.hexdigest(), tuple(w.checks))


def identity(fn: Any, *extra: str) -> Identity:
    """The code identity of ``fn`` (a function, bound method, partial, cute.jit wrapper or
    class); ``extra`` texts are mixed in. Raises :class:`UnkeyableCode`."""
    try:
        return _Walker().run(fn, extra)
    except UnstableKeyError as e:
        if isinstance(e, UnkeyableCode):
            raise
        raise UnkeyableCode(str(e), name=_name_of(fn), fix=_FIX) from None


def is_memory_only(key: Any) -> bool:
    """Whether a compile key holds a :data:`MEMORY_ONLY` element."""
    if isinstance(key, str):
        return key.startswith(MEMORY_ONLY)
    if isinstance(key, tuple):
        return any(is_memory_only(k) for k in key)
    return False


class IdentityCache:
    """``fn``'s current digest, recomputed only when :meth:`Identity.valid` says a read changed."""

    def __init__(self) -> None:
        self._memo: weakref.WeakKeyDictionary[Any, tuple[tuple[str, ...], Identity]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def get(self, fn: Any, *extra: str) -> Identity:
        try:
            hit = self._memo.get(fn)
        except TypeError:  # not weak-referenceable: no memo
            return identity(fn, *extra)
        if hit is not None and hit[0] == extra and hit[1].valid():
            return hit[1]
        ident = identity(fn, *extra)
        with self._lock:
            self._memo[fn] = (extra, ident)
        return ident


_default_cache = IdentityCache()


def current(fn: Any, *extra: str) -> Identity:
    """The identity of ``fn`` as its code and the values it reads are now (memoised while
    nothing it read has changed). Raises :class:`UnkeyableCode`."""
    return _default_cache.get(fn, *extra)


def current_digest(fn: Any, *extra: str) -> str:
    """``current(fn, *extra).digest``."""
    return _default_cache.get(fn, *extra).digest
