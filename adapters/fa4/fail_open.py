"""Fail open: trouble inside fa4cache never fails the user's FA4 call.

Between FA4 and the store, fa4cache encodes keys, values code, reads and writes the store,
takes locks, asks remote tiers and patches FA4. When any of that raises, the kernel is
compiled and run exactly as FA4 would without fa4cache and kept in memory only; one warning
per stage and cause names what went wrong and the fix, and the store counts it
(``fail_open``). Deliberate refusals are not trouble and still raise: an unexpected compile
under ``FA4CACHE_EXPECT_WARM=error`` is the user's own request.
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class Stage(str, enum.Enum):
    KEY = "key encoding"
    IDENTITY = "code identity"
    STORE_READ = "store read"
    STORE_WRITE = "store write"
    LOCK = "lock"
    REMOTE = "remote tier"
    COMPILE_SERVER = "compile server"
    PATCH = "patch"


FIXES: dict[Stage, str] = {
    Stage.KEY: "this FA4's compile key holds a value fa4cache cannot encode; "
    "run `fa4cache doctor` and report it with the FA4 version",
    Stage.IDENTITY: "fa4cache could not value this mask_mod/score_mod; give it a "
    "`__cute_hash__` or build it with @fa4cache.mask_template",
    Stage.STORE_READ: "run `fa4cache verify` on the store (FA4CACHE_DIR)",
    Stage.STORE_WRITE: "check that FA4CACHE_DIR is writable and has free space (`fa4cache doctor`)",
    Stage.LOCK: "check the store's filesystem supports locks (`fa4cache doctor`)",
    Stage.REMOTE: "the kernel was compiled here; check the cluster tier (`fa4cache doctor`)",
    Stage.COMPILE_SERVER: "set FA4CACHE_COMPILE_AHEAD=0 to stop background compiles",
    Stage.PATCH: "this FA4 may not be one fa4cache verified (`fa4cache doctor`)",
}

_lock = threading.Lock()
_warned: set[tuple[Stage, str]] = set()


def failed(stage: Stage, error: BaseException, *, what: str = "", store: Any = None) -> None:
    """Note that ``stage`` raised ``error``; the caller then carries on as plain FA4 would."""
    cause = type(error).__name__
    with _lock:
        first = (stage, cause) not in _warned
        _warned.add((stage, cause))
    if store is not None:
        try:
            store.counters.add("fail_open")
        except Exception:
            pass
    if first:
        log.warning(
            "fa4cache: %s failed%s (%s: %.300s); FA4 runs this call as without fa4cache, the kernel "
            "stays in memory. Fix: %s",
            stage.value,
            f" for {what}" if what else "",
            cause,
            error,
            FIXES[stage],
        )
    else:
        log.debug("fa4cache: %s failed again (%s: %s)", stage.value, cause, error)
