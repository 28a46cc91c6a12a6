"""Model load: a transformers model built for ``attn_implementation="fa4cache"`` starts its
whole kernel set compiling in the background, as ``warm --hf-config`` lists it, for this
process's target. The warm runner does it (``fa4cache.warm(plan, background=True)``,
:mod:`fa4cache.adapters.compile.background`): the compile server's workers take each
kernel through its per-key lock, and a set the store holds starts no server.
``FA4CACHE_COMPILE_AHEAD=0`` turns it off (:func:`fa4cache.adapters.compile.ahead.enabled`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
from typing import Any

from fa4cache.adapters.compile import ahead
from fa4cache.adapters.compile import server as compile_server
from fa4cache.adapters.compile.runner import warm

from fa4cache.aot.plan import WarmPlan
from fa4cache.store import runtime

log = logging.getLogger(__name__)

_lock = threading.Lock()
_started_sets: set[str] = set()


def start_model_set(specs: list[Any]) -> list[Any]:
    """Start compiling ``specs`` (a model's kernel set) in the background for this process's
    target. Returns the run started (a :class:`~fa4cache.adapters.compile.background.Warming`)
    as a one-item list; none when compile-ahead is off, no store is installed, no target is
    known, the set was started already in this process (``post_init`` runs for the inner
    model and for the wrapper), or the store holds it."""
    if not specs or not ahead.enabled() or runtime.installed_store() is None:
        return []
    target = compile_server.process_target()
    if target is None:
        return []
    sig = json.dumps([s.to_dict() for s in specs], sort_keys=True)
    with _lock:
        if sig in _started_sets:
            return []
        _started_sets.add(sig)
    plan = WarmPlan(tuple(dataclasses.replace(s, arch=target.arch) for s in specs), target)
    run = warm(plan, background=True, jobs=None)  # as many workers as kernels, within this process's cores
    labels = "; ".join(s.label() for s in specs)
    if run.skipped == "stored":
        # Nothing to compile ahead: no server (a process with torch and FA4 imported) beside
        # this one; a miss, if one comes, starts it then.
        log.info("fa4cache: the kernel set of %s is stored; no compile server started", labels)
    if not run.started:
        return []
    log.info("fa4cache: compiling the kernel set of %s in %d background worker(s)", labels, run.workers)
    return [run]


def specs_of_config(config: Any) -> list[Any]:
    """The specs ``warm --hf-config`` computes, from a transformers config object."""
    from fa4cache.aot.model_config import specs_for

    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if "num_attention_heads" not in d and isinstance(d.get("text_config"), dict):
        d = d["text_config"]
    return specs_for(d)


def watch_model_loads() -> None:
    """A transformers model built with ``attn_implementation="fa4cache"`` starts its kernel set
    compiling in the background (hooked on ``PreTrainedModel.post_init``, once)."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.post_init
    if getattr(original, "__fa4cache_compile_ahead__", False):
        return

    @functools.wraps(original)
    def post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            if ahead.enabled() and getattr(self.config, "_attn_implementation", None) == "fa4cache":
                start_model_set(specs_of_config(self.config))
        except Exception as e:  # the model must load whatever happens here
            # An optimisation skipped, not a problem: a shape warm cannot list compiles at its step.
            log.info("fa4cache: not compiling the model's kernels ahead (%s: %s)", type(e).__name__, e)
        return result

    post_init.__fa4cache_compile_ahead__ = True  # type: ignore[attr-defined]
    PreTrainedModel.post_init = post_init  # type: ignore[method-assign]
