"""Exceptions raised by fa4cache.

Every error derives from :class:`Fa4CacheError`, so callers can catch one type;
the subclasses say what went wrong without parsing messages.

Warnings are for what the user should change. :func:`quiet_library_warnings` ignores, for
the duration of one of fa4cache's own calls, the library warnings that name nothing the
user wrote (:data:`NOT_ACTIONABLE`): CUTLASS's ``Argument aux_data (position N) cannot be
converted to a JitArgument`` (~600 characters, on every compile of a mask with aux tensors:
FA4 passes them as a compile-time list) and PyTorch's ``Accessing the data pointer of
FakeTensor ... almost definitely a bug in your code`` (``warm`` traces FA4 on fake tensors;
nothing runs). The same warnings from the user's own code, outside those calls, still show.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class Fa4CacheError(Exception):
    """Base class of every fa4cache error."""


class ConfigError(Fa4CacheError, ValueError):
    """A setting (environment variable, argument, placeholder) is invalid.

    The message names the setting, so a misconfigured job fails loudly at start-up
    instead of silently running without a cache.
    """


class UnstableKeyError(Fa4CacheError, TypeError):
    """A compile-key element, or a value a mask's code reads, has no process-independent
    encoding.

    Storing such a key would produce a different digest in every process: a cache that
    never hits, or worse, one that hits for the wrong kernel.
    """


class InsecurePath(Fa4CacheError, PermissionError):
    """A cache path is a symlink, owned by an untrusted user, or writable by others."""


class FA4NotAvailable(Fa4CacheError, ImportError):
    """flash-attn-4 is missing, or its layout is not one this version of fa4cache knows."""


class UnkeyableCode(UnstableKeyError):
    """User code whose kernel no key can describe completely: it reads a value fa4cache
    cannot encode (an arbitrary object, a tensor, a user module as a whole) or its source
    changed since it was imported. Its kernels stay in memory only; ``name`` is what could
    not be keyed and ``fix`` what to do about it."""

    def __init__(self, message: str, *, name: str, fix: str) -> None:
        super().__init__(f"{message}. Fix: {fix}")
        self.reason = message
        self.name = name
        self.fix = fix


# (category, message regex matched at the start of the warning's text)
NOT_ACTIONABLE: tuple[tuple[type[Warning], str], ...] = (
    (UserWarning, r"Argument aux_data \(position \d+\) cannot be converted to a JitArgument"),
    (Warning, r"Accessing the data pointer of FakeTensor"),
)


@contextmanager
def quiet_library_warnings() -> Iterator[None]:
    """Ignore :data:`NOT_ACTIONABLE` inside the block (the filters before it are restored)."""
    with warnings.catch_warnings():
        for category, message in NOT_ACTIONABLE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
