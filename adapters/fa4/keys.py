"""FA4's callable hash, made sound for a persistent store.

FA4 (4.0.0b36) keys a kernel's ``mask_mod``, ``score_mod`` and ``score_mod_bwd`` with
``flash_attn.cute.utils.hash_callable``: source text plus ``repr`` of closure cells,
memoised on the function forever. That is enough for FA4's own in-process cache, which
dies with the process; persisted, it serves a kernel built for other code as soon as a
module constant, a helper in another module or an object's attribute changes. Installed,
fa4cache replaces it (in every FA4 module that holds it) with :func:`hash_callable`:

* an fa4cache mask carries its live identity (``__fa4cache_identity__``): used as is,
  when fa4cache set it on that very function (not a copy a wrapper inherited);
* an explicit ``__cute_hash__`` that the user set on the function (FA4's documented
  override) is trusted; one copied by ``functools.wraps`` or answered by ``__getattr__`` is not;
* anything else gets :func:`fa4cache.identity.current_digest`: its code and everything it
  reads, re-checked on every call, so a run-time change gets a new key;
* code that no key can describe completely gets a *memory-only* hash
  (:data:`MEMORY_ONLY`): FA4 still compiles and caches it in this process, the store never
  sees it, and one warning names what could not be keyed and the fix.

FA4's metadata mixing (``__vec_size__``) is kept as FA4 does it. No code generation
changes: the toolchain is the same.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
import weakref
from typing import Any

from fa4cache.errors import UnkeyableCode
from fa4cache.identity import MEMORY_ONLY, current_digest, fa4cache_identity, is_library_code, own_attr

log = logging.getLogger(__name__)

UTILS = "flash_attn.cute.utils"

_lock = threading.Lock()
_serial = itertools.count(1)
# Memory-only functions, numbered: two of them with the same source and closure reprs (the
# case FA4's hash confuses) must not share a kernel even within one process.
_serials: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_warned: set[str] = set()
# base function -> (its __cute_hash__, whether the user set it rather than FA4's own memo)
_explicit: weakref.WeakKeyDictionary[Any, tuple[str, bool]] = weakref.WeakKeyDictionary()


_original: Any = None  # FA4's own hash_callable, once seen


def _find_original() -> Any:
    global _original
    if _original is None:
        import sys

        fn = getattr(sys.modules.get(UTILS), "hash_callable", None)
        if fn is not None and fn is not hash_callable:
            _original = fn
    return _original


def _user_cute_hash(base: Any) -> str | None:
    """``base.__cute_hash__`` when the user set it: FA4's own hash_callable also writes it
    (its memo), and that value -- source plus closure reprs -- is exactly the unsound key."""
    value = own_attr(base, "__cute_hash__")
    if not isinstance(value, str):
        return None
    try:
        memo = _explicit.get(base)
    except TypeError:
        memo = None
    if memo is None or memo[0] != value:
        import sys

        utils = sys.modules.get(UTILS)
        compute = getattr(utils, "_compute_base_hash", None)
        explicit = compute is None or value != compute(base)
        memo = (value, explicit)
        try:
            _explicit[base] = memo
        except TypeError:
            pass
    return value if memo[1] else None


def _memory_only(func: Any, err: UnkeyableCode | None) -> str:
    """A key of this process alone; ``err`` is warned about once per name (None: the caller warned)."""
    with _lock:
        try:
            n = _serials.get(func)
            if n is None:
                n = _serials[func] = next(_serial)
        except TypeError:
            n = id(func)
        if err is None:
            return f"{MEMORY_ONLY}{n}"
        first = err.name not in _warned
        _warned.add(err.name)
    if first:
        log.warning(
            "fa4cache: %s is compiled in memory only, never stored: %s", getattr(func, "__name__", func), err
        )
    return f"{MEMORY_ONLY}{n}"


def base_hash(func: Any) -> str:
    """The store-worthy identity of a mask_mod / score_mod (see the module docstring)."""
    base = getattr(func, "__wrapped__", func)
    # What the wrapped function says of itself stands for a library's wrapper (cute.jit's),
    # not for a user's (its own code and state are more than the function it wraps).
    if base is not func and not is_library_code(func):
        base = func
    # Only what fa4cache itself set on the function (a partial bound to it), or an attribute
    # the user set on it: a functools.wraps copy or a __getattr__ delegate's is the inner
    # mask's, and the wrapper's own code would never reach the key.
    for f in (func, base):
        live = fa4cache_identity(f)
        if live is not None:
            try:
                return "fa4cache:" + str(live())
            except UnkeyableCode as e:
                return _memory_only(func, e)
    for f in (func, base):
        explicit = _user_cute_hash(f)
        if explicit is not None:
            return "explicit:" + explicit
    try:
        return "fa4cache:" + current_digest(func)
    except UnkeyableCode as e:
        return _memory_only(func, e)


def hash_callable(func: Any, mixer_attrs: tuple[str, ...] | None = None, set_cute_hash: bool = True) -> str:
    """Drop-in for FA4's ``hash_callable`` (same signature; ``set_cute_hash`` is ignored: a
    memo written on the function would outlive a change of what it covers)."""
    del set_cute_hash
    if mixer_attrs is None:
        mixer_attrs = _MIXER_DEFAULT
    try:
        h = base_hash(func)
    except Exception as e:
        # fa4cache's own trouble valuing the code (fail open): a memory-only key, so FA4
        # compiles and runs it as it would without fa4cache.
        from fa4cache.adapters.fa4 import fail_open

        fail_open.failed(fail_open.Stage.IDENTITY, e, what=getattr(func, "__name__", repr(func)))
        h = _memory_only(func, None)
    values = tuple(getattr(func, a, None) for a in mixer_attrs)
    if all(v is None for v in values):
        return h
    hasher = hashlib.sha256(h.encode())
    for attr, val in zip(mixer_attrs, values):
        hasher.update(f"{attr}={val!r}".encode())
    mixed = hasher.hexdigest()
    return f"{MEMORY_ONLY}{mixed}" if h.startswith(MEMORY_ONLY) else mixed


_MIXER_DEFAULT: tuple[str, ...] = ("__vec_size__",)


def patch_module(module: Any) -> list[tuple[Any, str, Any]]:
    """Replace FA4's ``hash_callable`` wherever ``module`` holds it; returns what to restore."""
    global _MIXER_DEFAULT
    original = _find_original()
    if original is None:
        return []
    if original.__defaults__:
        _MIXER_DEFAULT = tuple(original.__defaults__[0])
    done = []
    for name, obj in list(vars(module).items()):
        if obj is original:
            setattr(module, name, hash_callable)
            done.append((module, name, original))
    return done
