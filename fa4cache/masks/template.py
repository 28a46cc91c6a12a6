"""Mask templates: geometry-free ``mask_mod`` factories with process-independent hashes.

FA4 keys its compile cache on a hash of the ``mask_mod``: its source plus ``repr()`` of
the values it captures. A mask that captures sequence lengths compiles again for every
batch layout, and one that captures a nested helper compiles again in every process
(the helper's repr holds a memory address). A template's arguments are the few
specialisations that really change the generated code; its ``mask_mod`` reads all
geometry from aux tensors and carries its live identity: the mask's code,
everything it reaches and reads (:mod:`fa4cache.identity`), the template's extra
``sources`` and the specialisation values, re-checked whenever a key is asked for.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from fa4cache.errors import ConfigError, UnkeyableCode
from fa4cache.hashing import encode_key
from fa4cache.identity import Identity, current_digest, identity

log = logging.getLogger(__name__)

# A mask_mod whose kept keys are a union of per-row intervals names, under this
# attribute, a ``@cute.jit`` function ``(batch_idx, head_idx, q_idx, seqlen_info,
# aux_tensors) -> ((lo, hi), ...)``; the FA4 adapter's interval masking reads it.
ROW_INTERVALS_ATTR = "__fa4cache_row_intervals__"


class _Unkeyable:
    def valid(self) -> bool:
        return True


_UNKEYABLE: Any = _Unkeyable()


class MaskTemplate:
    """A geometry-free mask factory; calling it with specialisations gives a ``mask_mod``.

    The same specialisation always returns the same ``mask_mod`` object, whose
    ``__cute_hash__`` is identical across processes and ``PYTHONHASHSEED`` values and
    differs whenever the generated code can differ (other source, other specialisation).
    """

    def __init__(
        self,
        factory: Callable[..., Callable[..., Any]],
        name: str | None = None,
        sources: tuple[str, ...] = (),
    ) -> None:
        self.factory = factory
        self.name = name or factory.__name__
        # Texts the generated code depends on beyond what the factory reaches (hashed too).
        self.sources = tuple(sources)
        self._mods: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._factory: Identity | _Unkeyable | None = None
        # Bound on every mask build (a per-step call): computed once here.
        self._signature = inspect.signature(factory)
        functools.update_wrapper(self, factory)

    def _normalise(self, spec: dict[str, Any]) -> dict[str, Any]:
        # Defaults are filled in, so that f(causal=True) and f(causal=True, x=<default>)
        # are the same specialisation (same object, same hash).
        try:
            bound = self._signature.bind(**spec)
        except TypeError as e:
            raise ConfigError(f"mask template {self.name}: {e}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def spec_text(self, **spec: Any) -> str:
        spec = self._normalise(spec)
        try:
            return encode_key(tuple(sorted(spec.items())))
        except Exception as e:
            raise ConfigError(
                f"mask template {self.name}: specialisation values must be plain constants "
                f"(int, float, bool, str, None, tuples of them): {e}"
            ) from None

    def hash_for(self, **spec: Any) -> str:
        """The specialisation's hash as its code and everything it reads are now; raises
        :class:`~fa4cache.errors.UnkeyableCode` when no key can describe it."""
        return self._live(self(**spec), self.spec_text(**spec))

    def _live(self, mod: Callable[..., Any], text: str) -> str:
        digest = current_digest(mod, *self.sources)
        return hashlib.sha256(f"{digest}\0{self.name}\0{text}".encode()).hexdigest()

    def __call__(self, **spec: Any) -> Callable[..., Any]:
        text = self.spec_text(**spec)
        mod = self._mods.get(text)
        if mod is not None and self._factory_unchanged():
            return mod
        with self._lock:
            if not self._factory_unchanged():
                self._mods.clear()
            mod = self._mods.get(text)
            if mod is None:
                mod = self.factory(**spec)
                # The store's key (fa4cache.adapters.fa4.keys) asks this at every call.
                mod.__fa4cache_identity__ = functools.partial(self._live, mod, text)  # type: ignore[attr-defined]
                mod.__fa4cache_mask__ = {"template": self.name, "spec": self._normalise(spec)}  # type: ignore[attr-defined]
                try:
                    # For FA4 without fa4cache installed (its in-process cache).
                    mod.__cute_hash__ = self._live(mod, text)  # type: ignore[attr-defined]
                except UnkeyableCode as e:
                    log.warning("fa4cache: mask template %s compiles in memory only: %s", self.name, e)
                self._mods[text] = mod
        return mod

    def _factory_unchanged(self) -> bool:
        """False once something the factory reads has changed since its masks were built
        (they hold the old values in their closures)."""
        ident = self._factory
        if ident is not None and ident.valid():
            return True
        try:
            self._factory = identity(self.factory)
        except UnkeyableCode:
            # Not keyable as a whole: each mask's own identity says so, at every call.
            self._factory = _UNKEYABLE
            return True
        return ident is None


def mask_template(
    factory: Callable[..., Any] | None = None, *, name: str | None = None, sources: tuple[str, ...] = ()
) -> Any:
    """Decorator turning a mask factory into a :class:`MaskTemplate`.

    Example::

        @fa4cache.mask_template
        def banded(width: int):
            @cute.jit
            def mask_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
                start = aux_tensors[0]                 # geometry: per-row tensor
                s = utils.scalar_to_ssa(start[batch[0], m_idx[0]], cutlass.Int32)
                return (n_idx >= s) & (n_idx < s + width)   # width: a specialisation
            return mask_mod

        mask_mod = banded(width=64)                     # same object, same hash, every time

    ``sources``: extra texts the generated code depends on (hashed with the factory).
    A mask that is a union of per-row key intervals may also set
    ``mask_mod.__fa4cache_row_intervals__`` (:data:`ROW_INTERVALS_ATTR`): FA4's Hopper
    kernels then mask its partial tiles per row (see docs/masks.md).
    """
    if factory is None:
        return lambda f: MaskTemplate(f, name, sources)
    return MaskTemplate(factory, name, sources)
