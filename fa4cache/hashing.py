"""Process-independent encodings and digests.

Making a hash mean the same thing in every process:

* :func:`encode_key` turns one of FA4's compile-key tuples into canonical text.
  Python's ``hash()`` is salted per process (``PYTHONHASHSEED``) and ``pickle``
  output depends on object identity and protocol details, so neither may name a file
  that another process must find. Anything without a stable encoding raises
  :class:`~fa4cache.errors.UnstableKeyError` instead of yielding a key that silently
  never hits.

What a *function* is (a mask's or a jit kernel's code and what it reads) is
:mod:`fa4cache.identity`'s question.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
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
    if _is_toolchain_config(value):
        # FA4's own configs (4.0.0b40 keys its forward by a FwdConfig): by every field's
        # value. Their class definitions are covered by the toolchain id, which digests
        # FA4's sources; a field without a stable encoding refuses the whole key.
        cls = type(value)
        return {
            "dc": _qualified(cls, path),
            "v": {
                f.name: _encode(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value)
            },
        }
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


# Packages whose frozen dataclasses may stand in a compile key by value: their sources are
# part of the toolchain id (fa4cache.fingerprint), so one class name means one definition.
TOOLCHAIN_PACKAGES = ("flash_attn.", "quack.")


def _is_toolchain_config(value: Any) -> bool:
    cls = type(value)
    params = getattr(cls, "__dataclass_params__", None)
    return (
        params is not None
        and params.frozen
        and dataclasses.is_dataclass(value)
        and cls.__module__.startswith(TOOLCHAIN_PACKAGES)
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
