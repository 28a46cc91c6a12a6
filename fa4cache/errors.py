"""Exceptions raised by fa4cache.

Every error derives from :class:`Fa4CacheError`, so callers can catch one type;
the subclasses say what went wrong without parsing messages.
"""

from __future__ import annotations


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
