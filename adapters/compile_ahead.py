"""Compile-ahead: the kernels a step will need compile side by side, before it asks.

* **Forward miss.** When this process misses on a forward kernel, the backward kernels
  of the same call (listed by FA4's own keys, :mod:`.kernel_set`) start compiling at once
  in worker processes (:mod:`.compile_pool`, a GPU-blind CPU cross-compile) while this
  process compiles the forward. The backward then finds them in the store, or waits on
  the lock the worker holds: the per-key lock means no kernel is compiled twice.
* **Waiting helps.** A process blocked on another's compile of a forward kernel compiles
  not-yet-started kernels of the same set meanwhile, each taken through ``try_lock``.
* **Model load.** :func:`start_model_set` (called when a transformers model is built for
  ``attn_implementation="fa4cache"``) starts the model's whole kernel set, as ``warm
  --hf-config`` lists it.
* On a GPU host, a few workers start (importing FA4) when FA4 is imported, so that a
  cold step does not wait for a worker's imports; they leave once a forward hits.

``FA4CACHE_COMPILE_AHEAD=0`` turns all of it off. ``fa4cache stats`` counts the kernels
compiled ahead and the compile seconds they kept off the critical path.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fa4cache.settings import setting
from fa4cache.store import installed as runtime

from . import compile_cache, compile_pool, kernel_set
from .kernel_set import CallJob, Kernel

log = logging.getLogger(__name__)

_tl = threading.local()
_lock = threading.Lock()
_launched: dict[str, float] = {}  # digest -> when a worker of ours started compiling it
_standby: list[compile_pool.Worker] = []
_standby_done = False
_model_sets: set[str] = set()
MAX_STANDBY = 4


def enabled() -> bool:
    return bool(setting("FA4CACHE_COMPILE_AHEAD")) and not compile_cache.ahead_is_off()


off = compile_cache.ahead_off  # no compile-ahead in this thread (``warm`` compiles the whole set)


# ------------------------------------------------------------------ the forward call


def wrap_forward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FA4's ``_flash_attn_fwd``, remembering its arguments while it runs (a miss then knows
    the call whose backward to start)."""

    @functools.wraps(fn)
    def forward(*args: Any, **kwargs: Any) -> Any:
        prev = getattr(_tl, "call", None)
        _tl.call = (args, kwargs)
        watch = prev is None and _standby and not _standby_done
        misses = _misses() if watch else 0
        try:
            return fn(*args, **kwargs)
        finally:
            _tl.call = prev
            if watch and _misses() == misses:
                _retire_standby()

    forward.__fa4cache_ahead__ = True  # type: ignore[attr-defined]
    start_standby()
    return forward


_BWD_SHARED = (
    "softmax_scale", "causal", "window_size_left", "window_size_right", "cu_seqlens_q", "cu_seqlens_k",
    "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k", "score_mod", "mask_mod", "aux_tensors",
    "aux_scalars", "learnable_sink",
)  # fmt: skip


def backward_job(args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallJob | None:
    """The ``_flash_attn_bwd`` call that autograd makes for this forward call, as a job
    that travels to a worker; None when there is no backward to compile (no input needs a
    gradient, a decode call) or the call cannot travel (a callable that does not pickle)."""
    import inspect

    from flash_attn.cute import interface as fi

    from .mask_tiles import fit_to_head_dim

    p = inspect.signature(fi._flash_attn_fwd).bind(*args, **kwargs).arguments
    q, k, v = p.get("q"), p.get("k"), p.get("v")
    if q is None or k is None or v is None or p.get("qv") is not None or p.get("page_table") is not None:
        return None
    from flash_attn.cute.testing import is_fake_mode

    # A cross-compile (fake tensors) cannot say whether a gradient will be asked: assume so.
    if not is_fake_mode() and not any(t.requires_grad for t in (q, k, v)):
        return None
    kw = {n: p[n] for n in _BWD_SHARED if p.get(n) is not None}
    kw["softcap"] = p.get("softcap") or 0.0
    bst = p.get("block_sparse_tensors")
    if bst is not None:
        from fa4cache.masks.mask import AttentionMask

        mask = AttentionMask.owning(bst)
        if mask is None or mask.block_sparse_tensors_bwd is None:
            return None
        kw["block_sparse_tensors"] = fit_to_head_dim(q, mask.block_sparse_tensors_bwd)
    out_shape = (*q.shape[:-1], v.shape[-1])
    out = kernel_set.TensorMeta(out_shape, _contiguous(out_shape), str(q.dtype).removeprefix("torch."))
    lse = p.get("lse")
    if lse is None:
        varlen = q.dim() == 3
        lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
        lse = kernel_set.TensorMeta(lse_shape, _contiguous(lse_shape), "float32")
    try:
        qkv = tuple(kernel_set.describe(t) for t in (q, k, v))
        return CallJob(
            "_flash_attn_bwd",
            (*qkv, out, out, kernel_set.describe(lse)),
            kernel_set.describe(kw),
        )
    except TypeError as e:
        log.debug("fa4cache: no compile-ahead for this call: %s", e)
        return None


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


# ------------------------------------------------------------------ miss events


def _on_miss(event: str, cache: Any, key: Any, ref: Any, waited: float) -> None:
    if event == "loaded":
        _count_saved(ref, waited)
        return
    if cache.kind != "fwd" or not enabled():
        return
    call = getattr(_tl, "call", None)
    if call is None or getattr(_tl, "busy", False):
        return
    _tl.busy = True
    try:
        if event == "compiling":
            _start_backward(call)
        elif event == "waiting":
            _help_while_held(call, ref)
    finally:
        _tl.busy = False


compile_cache.miss_hooks.append(_on_miss)


def _missing(kernels: list[Kernel]) -> list[Kernel]:
    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    if store is None or tc is None or not store.writable:
        return []
    from fa4cache.store.paths import EntryRef

    with _lock:
        launched = set(_launched)
    return [
        k
        for k in kernels
        if k.digest not in launched
        and not store.layout.sidecar_path(EntryRef(tc.id, k.kind, k.digest)).exists()
    ]


def _plan_backward(call: tuple[Any, Any]) -> tuple[CallJob, list[Kernel]] | None:
    job = backward_job(*call)
    if job is None:
        return None
    return job, _missing(kernel_set.plan(job.run))


def _start_backward(call: tuple[Any, Any]) -> None:
    planned = _plan_backward(call)
    if not planned or not planned[1]:
        return
    job, kernels = planned
    tc = runtime.current_toolchain()
    assert tc is not None
    task = {
        "jobs": [job],
        "targets": [k.digest for k in kernels],
        "wait": False,
        "ahead": True,
        "toolchain": tc.id,
    }
    now = time.perf_counter()
    with _lock:
        for k in kernels:
            _launched.setdefault(k.digest, now)
    n = min(len(kernels), compile_pool.cpu_count())
    workers = _take_standby(n)
    env = compile_pool.target_env(tc.arch, tc.num_sms)
    if env is None:
        return
    store = runtime.installed_store()
    assert store is not None
    env["FA4CACHE_DIR"] = str(store.root)
    workers += compile_pool.start(n - len(workers), env, on_started=_started)
    for w in workers:
        w.submit(task)
        w.close(wait=False)  # it exits when the task is done
    log.info(
        "fa4cache: compiling %d backward kernel(s) ahead in %d background worker(s): %s",
        len(kernels),
        len(workers),
        ", ".join(k.kind for k in kernels),
    )


def _help_while_held(call: tuple[Any, Any], ref: Any) -> None:
    """Blocked on another process's forward compile: compile the backward kernels of this
    call that nobody has started, until the forward is published."""
    store = runtime.installed_store()
    if store is None or not store.locks.held_by_other(ref.digest):
        return
    planned = _plan_backward(call)
    if not planned:
        return
    job, kernels = planned
    for k in kernels:
        if not store.locks.held_by_other(ref.digest):
            return
        try:
            held = store.locks.try_lock(k.digest)
        except OSError:
            return
        if held is None:
            continue  # someone is compiling it already
        t0 = time.perf_counter()
        outcome = kernel_set.compile_one(job.run, k, held)
        if outcome == "compiled":
            store.counters.add("ahead_compiles")
            store.counters.add("ahead_saved_seconds", time.perf_counter() - t0)
            log.info("fa4cache: compiled %s while waiting for another process's forward", k.kind)


def _count_saved(ref: Any, waited: float) -> None:
    with _lock:
        started = _launched.pop(ref.digest, None)
    if started is None:
        return
    store = runtime.installed_store()
    if store is None:
        return
    side = store.read_sidecar(ref)
    seconds = getattr(side, "compile_seconds", None) if side is not None else None
    if seconds:
        store.counters.add("ahead_saved_seconds", max(0.0, float(seconds) - waited))


def _started(kind: str, digest: str) -> None:
    with _lock:
        _launched.setdefault(digest, time.perf_counter())


# ------------------------------------------------------------------ standby workers


def _standby_count() -> int:
    import os

    per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    return max(1, min(MAX_STANDBY, compile_pool.cpu_count() // max(per_node, 1) - 1))


def start_standby() -> None:
    """On a GPU host, start workers now (they import FA4 while this process does), for a
    cold first step; CPU-only processes start workers when a miss needs them."""
    global _standby_done
    if _standby or _standby_done or not enabled():
        return
    from .cross_compile import gpu_present

    store = runtime.installed_store()
    if store is None or not store.writable or not gpu_present():
        return
    env = compile_pool.target_env()
    if env is None:
        return
    env["FA4CACHE_DIR"] = str(store.root)
    _standby.extend(compile_pool.start(_standby_count(), env, on_started=_started))


def _take_standby(n: int) -> list[compile_pool.Worker]:
    with _lock:
        taken = [w for w in _standby if w.proc.poll() is None][:n]
        for w in taken:
            _standby.remove(w)
    return taken


def _misses() -> float:
    store = runtime.installed_store()
    return store.counters.values["misses"] if store is not None else 0


def _retire_standby() -> None:
    """After a forward that compiled nothing, the idle standby workers leave."""
    global _standby_done
    _standby_done = True
    with _lock:
        idle, _standby[:] = list(_standby), []
    for w in idle:
        w.close(wait=False)


# ------------------------------------------------------------------ model load


def start_model_set(specs: list[Any]) -> list[compile_pool.Worker]:
    """Start compiling ``specs`` (a model's kernel set) in background workers; returns them."""
    import json

    if not specs or not enabled():
        return []
    sig = json.dumps([s.to_dict() for s in specs], sort_keys=True)
    with _lock:
        if sig in _model_sets:
            return []
        _model_sets.add(sig)
    store = runtime.installed_store()
    env = compile_pool.target_env()
    if store is None or not store.writable or env is None:
        return []
    env["FA4CACHE_DIR"] = str(store.root)
    from .warm_parallel import default_jobs

    global _standby_done
    _standby_done = True  # these workers are the standby
    n = default_jobs(specs)
    workers = _take_standby(n)
    workers += compile_pool.start(n - len(workers), env, on_started=_started)
    task = {
        "jobs": [kernel_set.SpecJob(s.to_dict()) for s in specs],
        "targets": None,
        "wait": False,
        "ahead": True,
    }
    for w in workers:
        w.submit(task)
        w.close(wait=False)
    log.info(
        "fa4cache: compiling the kernel set of %s in %d background worker(s)",
        "; ".join(s.label() for s in specs),
        len(workers),
    )
    return workers


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
            if enabled() and getattr(self.config, "_attn_implementation", None) == "fa4cache":
                start_model_set(specs_of_config(self.config))
        except Exception as e:  # the model must load whatever happens here
            # An optimisation skipped, not a problem: a shape warm cannot list compiles at its step.
            log.info("fa4cache: not compiling the model's kernels ahead (%s: %s)", type(e).__name__, e)
        return result

    post_init.__fa4cache_compile_ahead__ = True  # type: ignore[attr-defined]
    PreTrainedModel.post_init = post_init  # type: ignore[method-assign]


compile_cache.forward_wrappers.append(wrap_forward)
