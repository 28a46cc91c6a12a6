"""Whether a dict changed, without reading it: CPython's per-dict version tag.

CPython 3.11 to 3.13 give every dict a 64-bit version (``ma_version_tag``, PEP 509) that takes a
new, interpreter-wide unique value at each change to the dict: an item added, replaced or
removed, by any path (a module's or class's attribute set, ``update``, ``clear``, the
interpreter's specialised stores). A dict whose tag reads as it did has had no change since.
The run-time patch check (:mod:`fa4cache.patched_code`) reads the tags of the modules' and
classes' namespaces it judged instead of comparing every name and value again.

The tag is no public API: it is read through ``ctypes`` at its offset in ``PyDictObject``. So it is
used only where that was checked: CPython 3.11, 3.12 and 3.13, 64-bit, with the GIL, no debug
build, and only after :func:`reader` has seen, on dicts of its own, that the field there holds
the dict's length just before it (the layout) and that each kind of change moves the tag.
Anywhere else :func:`reader` returns None and the caller compares what the dicts hold.
"""

from __future__ import annotations

import logging
import operator
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

# The interpreters whose PyDictObject was checked to be {PyObject_HEAD; Py_ssize_t ma_used;
# uint64_t ma_version_tag; ...} with the tag moved at every change (3.14 drops the version).
VERIFIED = ((3, 11), (3, 12), (3, 13))
_USED_AT = 16  # after ob_refcnt and ob_type (64-bit, no Py_TRACE_REFS)
_TAG_AT = 24

# addresses (of the tags, :func:`addresses`) -> the tags there now
Reader = Callable[[Iterable[int]], list[int]]

_lock = threading.Lock()
_reader: Reader | None = None
_decided = False


def reader() -> Reader | None:
    """A function from dicts to their version tags, or None where the tag cannot be trusted
    here (decided once per process; see the module's docstring)."""
    global _reader, _decided
    if _decided:
        return _reader
    with _lock:
        if not _decided:
            try:
                _reader = _checked()
            except Exception as e:  # never the caller's trouble: it compares contents instead
                log.debug("fa4cache: dict version tags not used: %s: %s", type(e).__name__, e)
                _reader = None
            _decided = True
    return _reader


def _unverified() -> str | None:
    if sys.implementation.name != "cpython":
        return f"{sys.implementation.name}, not CPython"
    if sys.version_info[:2] not in VERIFIED:
        return f"CPython {sys.version_info[0]}.{sys.version_info[1]} (checked: 3.11-3.13)"
    if sys.maxsize != 2**63 - 1:
        return "not a 64-bit build"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "a free-threaded build"
    if hasattr(sys, "gettotalrefcount"):
        return "a debug build"
    return None


def _checked() -> Reader | None:
    why = _unverified()
    if why is not None:
        log.debug("fa4cache: dict version tags not used: %s", why)
        return None
    import ctypes

    u64, ssize = ctypes.c_uint64, ctypes.c_ssize_t
    value = operator.attrgetter("value")

    def read(addresses: Iterable[int]) -> list[int]:
        return list(map(value, map(u64.from_address, addresses)))

    # The layout: ma_used is where it should be, on dicts of several lengths.
    probe: dict[Any, Any] = {}
    for n in range(4):
        if ssize.from_address(id(probe) + _USED_AT).value != len(probe):
            log.debug("fa4cache: dict version tags not used: unexpected dict layout")
            return None
        probe[n] = n

    # Every kind of change moves the tag: of a plain dict, a module's namespace, a class's.
    module = types.ModuleType("_fa4cache_tag_probe")

    class Probe:
        pass

    class_dict = _class_dict(Probe)
    if class_dict is None:
        return None
    changes: list[tuple[dict[Any, Any], Callable[[], Any]]] = [
        (probe, lambda: probe.__setitem__("k", 1)),
        (probe, lambda: probe.__setitem__("k", 2)),
        (probe, lambda: probe.__delitem__("k")),
        (probe, lambda: probe.update(k=3)),
        (probe, lambda: probe.pop("k")),
        (probe, lambda: probe.setdefault("k", 4)),
        (probe, lambda: probe.popitem()),
        (probe, lambda: probe.clear()),
        (vars(module), lambda: setattr(module, "x", 1)),
        (vars(module), lambda: setattr(module, "x", 2)),
        (vars(module), lambda: delattr(module, "x")),
        (class_dict, lambda: setattr(Probe, "x", 1)),
        (class_dict, lambda: setattr(Probe, "__module__", "elsewhere")),
        (class_dict, lambda: delattr(Probe, "x")),
    ]
    for d, change in changes:
        before = read(addresses([d]))
        change()
        if read(addresses([d])) == before:
            log.debug("fa4cache: dict version tags not used: a change left the tag as it was")
            return None
    return read


def addresses(dicts: Iterable[dict[Any, Any]]) -> list[int]:
    """Where each dict's tag lies: valid while the dict lives (the caller holds it)."""
    return list(map(_TAG_AT.__add__, map(id, dicts)))


def _class_dict(klass: type) -> dict[Any, Any] | None:
    """The dict behind ``klass.__dict__`` (a read-only proxy of it), or None. (ctypes' classes
    keep theirs in a subclass of dict, written to through the same C calls.)"""
    import gc

    inner = gc.get_referents(_CLASS_DICT(klass))
    return inner[0] if len(inner) == 1 and isinstance(inner[0], dict) else None


_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__  # the interpreter's own getters:
_CLASS_DICT = type.__dict__["__dict__"].__get__  # a (meta)class cannot answer otherwise


def namespace(obj: Any) -> dict[Any, Any] | None:
    """The dict ``vars(obj)`` shows, for a module or a class: the one whose tag says whether it
    changed. None for anything else, and where ``vars(obj)`` is not that dict (a ``__dict__``
    of a module's subclass or a metaclass that answers with another: its tag would say
    nothing of what the module or class holds)."""
    if isinstance(obj, types.ModuleType):
        d = _MODULE_DICT(obj)
        return d if type(d) is dict and vars(obj) is d else None
    if isinstance(obj, type):
        d = _class_dict(obj)
        shown = vars(obj)
        return d if d is not None and _proxied(shown) is d else None
    return None


def _proxied(proxy: Any) -> Any:
    import gc

    inner = gc.get_referents(proxy) if isinstance(proxy, types.MappingProxyType) else []
    return inner[0] if len(inner) == 1 else None
