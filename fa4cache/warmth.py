"""Zero JIT after warm-up, on request: a compile then is a loud warning or an error.

A job whose kernels were warmed (``fa4cache warm``, a bundle, a previous run) should never
compile again; when it does, a 5-15 s stall hides inside a step (vLLM's goal, "zero JIT
compilation during runtime", is the same). ``FA4CACHE_EXPECT_WARM=1`` (or ``warn``) makes
every compile a warning naming the kernel and why it missed; ``=error`` raises
:class:`UnexpectedCompile` before the compile starts. :func:`expect_warm` does the same for
a block of code::

    with fa4cache.expect_warm():          # or expect_warm("error")
        for batch in loader: train_step(batch)

Separately, a kernel family that compiles again and again with one key field differing
each time (a tensor's value in the key, ``max_seqlen`` changing every call) is warned about
once, naming the field: :func:`note_compile`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .errors import Fa4CacheError
from .settings import setting

log = logging.getLogger(__name__)

_tl = threading.local()
STORM_AFTER = 3  # compiles of one kind, each differing from the last in the same one field
_storm_state: dict[str, Any] = {}  # kind -> its last compiled key, the field, the streak


class UnexpectedCompile(Fa4CacheError, RuntimeError):
    """A kernel compiled while fa4cache was told the job is warm (``FA4CACHE_EXPECT_WARM=error``)."""


def mode() -> str:
    """``"off"``, ``"warn"`` or ``"error"``: the innermost :func:`expect_warm`, else the setting."""
    inner = getattr(_tl, "mode", None)
    if inner is not None:
        return str(inner)
    value = setting("FA4CACHE_EXPECT_WARM")
    return {"0": "off", "1": "warn"}.get(value, value)


@contextmanager
def expect_warm(on_compile: str = "warn") -> Iterator[None]:
    """Inside the block, every kernel compile is a warning (``"warn"``) or raises
    :class:`UnexpectedCompile` (``"error"``); ``"off"`` lifts an outer one."""
    if on_compile not in ("warn", "error", "off"):
        raise ValueError(f"expect_warm(on_compile={on_compile!r}): expected 'warn', 'error' or 'off'")
    prev = getattr(_tl, "mode", None)
    _tl.mode = on_compile
    try:
        yield
    finally:
        _tl.mode = prev


def check(kind: str, why: str | None) -> None:
    """Called right before a kernel compiles; ``why``: the near-miss explanation, if any."""
    m = mode()
    if m == "off":
        return
    text = (
        f"fa4cache: a {kind} kernel compiles after warm-up (FA4CACHE_EXPECT_WARM / expect_warm): "
        f"{why or 'no stored key of this kind is close'}"
    )
    if m == "error":
        raise UnexpectedCompile(text + ". Warm it first (fa4cache warm, a bundle), or lift the check.")
    log.warning("%s", text)


def note_compile(kind: str, encoded: str, names: Sequence[str] | None) -> None:
    """Warn once per kind when its compiles keep differing from the previous one in the same
    single field: that field changes every call and defeats every cache."""
    from .store.nearmiss import _field, diff

    state = _storm_state
    prev = state.get(kind)
    try:
        key = json.loads(encoded)
    except ValueError:
        return
    field = None
    if prev is not None:
        fields = diff(key, prev["key"])
        field = fields[0][0] if len(fields) == 1 else None
    streak = prev["streak"] + 1 if prev is not None and field is not None and field == prev["field"] else 1
    state[kind] = {"key": key, "field": field, "streak": streak, "warned": bool(prev and prev["warned"])}
    if streak >= STORM_AFTER - 1 and not state[kind]["warned"] and field is not None:
        state[kind]["warned"] = True
        log.warning(
            "fa4cache: %s compiled %d times in a row, each time with another %s: a value that changes "
            "every call is part of its key (a tensor or a length passed where a constant belongs); make it "
            "static, or bucket it",
            kind,
            streak + 1,
            _field(field, names),
        )
