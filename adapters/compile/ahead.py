"""Compile-ahead: the kernels a step will need compile side by side, before it asks.

* **Forward call.** While this process's compile server runs (it starts on a cold store),
  a forward call hands the backward of the same call to it as the call starts, before the
  forward is keyed or looked up; a process with no server does so at its forward's miss.
  The backward's kernels (listed by FA4's own keys, :mod:`fa4cache.adapters.compile.kernel_set`)
  start compiling at once, one per process forked by the compile server
  (:mod:`fa4cache.adapters.compile.server`, a GPU-blind CPU cross-compile that has imported
  FA4 already), while this process compiles the forward; a worker that finds a kernel stored
  takes nothing. The backward then finds them in the store, or waits on the lock the worker
  holds: the per-key lock means no kernel is compiled twice. Each backward goes to a server once.
* **Waiting helps.** A process blocked on another's compile of a forward kernel starts the
  not-yet-started kernels of the same set meanwhile (in its server's children, else in
  itself), each taken through ``try_lock``.
* **Model load.** A transformers model built for ``attn_implementation="fa4cache"`` starts
  its whole kernel set, as ``warm --hf-config`` lists it, through the warm runner's
  ``background=True`` (:mod:`fa4cache.adapters.transformers.model_load`), whose workers
  this process's compile server forks.
* On a GPU host the compile server starts at ``fa4cache.install()`` and imports FA4 beside
  this process's own imports, so that a cold step never waits for an import; it learns the
  target at the first miss (when this process already uses its GPU), leaves after a run of
  forward calls that compiled nothing, and starts again at a later miss.

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

from fa4cache.adapters.compile import kernel_set
from fa4cache.adapters.compile import server as compile_server
from fa4cache.adapters.compile.kernel_set import CallJob, Kernel
from fa4cache.adapters.compile.task import CompileTask, cpu_count
from fa4cache.adapters.fa4 import compile_cache, events
from fa4cache.adapters.fa4.events import MissEvent, MissStage

from fa4cache.settings import setting
from fa4cache.store import runtime

log = logging.getLogger(__name__)

_tl = threading.local()
_lock = threading.Lock()
_launched: dict[str, float] = {}  # digest -> when a worker of ours started compiling it
_server: compile_server.CompileServer | None = None
_quiet_forwards = 0  # forward calls in a row that compiled nothing
_sent: set[tuple[str, str]] = set()  # (toolchain, backward job) handed to the running server
# Forward calls in a row with no compile after which the server leaves (its memory back):
# a few steps of a model, whose layers call the forward once each.
RETIRE_AFTER = 64


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
        watch = prev is None and _server is not None
        misses = _misses() if watch else 0
        try:
            if watch:
                _start_early((args, kwargs))
            return fn(*args, **kwargs)
        finally:
            _tl.call = prev
            if watch:
                _after_forward(compiled=_misses() != misses)

    forward.__fa4cache_ahead__ = True  # type: ignore[attr-defined]
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

    from fa4cache.adapters.fa4.mask_tiles import fit_to_head_dim
    from flash_attn.cute import interface as fi

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


def _on_miss(event: MissEvent) -> None:
    ref = event.ref
    if event.stage is MissStage.LOADED:
        _count_saved(ref, event.waited)
        return
    if event.kind != "fwd" or not enabled():
        return
    call = getattr(_tl, "call", None)
    if call is None or getattr(_tl, "busy", False):
        return
    _tl.busy = True
    try:
        if event.stage is MissStage.COMPILING:
            _start_backward(call)
        elif event.stage is MissStage.WAITING:
            if _server is not None and _server.proc.poll() is None:
                # The server's children take them (it imported FA4 long ago): this process
                # stays free to load the forward the moment it is published. One worker:
                # the process compiling the forward has most likely started them already.
                _start_backward(call, kernels=1)
            else:
                _help_while_held(call, ref)
    finally:
        _tl.busy = False


events.listen(_on_miss)


def _missing(kernels: list[Kernel]) -> list[Kernel]:
    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    if store is None or tc is None or not store.writable:
        return []
    from fa4cache.store.paths import EntryRef

    with _lock:
        launched = set(_launched)
    return [
        k for k in kernels if k.digest not in launched and not store.has(EntryRef(tc.id, k.kind, k.digest))
    ]


def _plan_backward(call: tuple[Any, Any]) -> tuple[CallJob, list[Kernel]] | None:
    job = backward_job(*call)
    if job is None:
        return None
    return job, _missing(kernel_set.plan(job.run))


# A backward's kernels: preprocess, the backward, and one or two postprocess conversions.
BACKWARD_KERNELS = 4


def _start_early(call: tuple[Any, Any]) -> None:
    """While this process's compile server runs (a cold store) and forwards still compile, hand
    the backward of a forward call to it as the call starts, before FA4 keys, looks up and
    compiles the forward: the backward, the step's slowest kernel, then starts that much
    sooner. Workers that find its kernels stored take nothing; each call's backward goes once
    to a server."""
    if getattr(_tl, "busy", False):
        return
    _tl.busy = True
    try:
        server = _server
        # Only while forward calls still compile (the first, and each after one that did): a
        # step whose forwards all load hands nothing over (a new shape goes at its miss), and a
        # server that died is started again at a miss, never by a call that may miss nothing.
        if _quiet_forwards == 0 and server is not None and server.proc.poll() is None and enabled():
            _start_backward(call)
    except Exception as e:  # only a head start: the forward's miss hands it over as before
        log.debug("fa4cache: backward not started ahead of the forward: %s: %s", type(e).__name__, e)
    finally:
        _tl.busy = False


def _start_backward(call: tuple[Any, Any], kernels: int = BACKWARD_KERNELS) -> None:
    """Hand the backward of ``call`` to the server's workers, as many as ``kernels`` (within
    this process's share of the cores), unless this server has it already. Its kernels are
    listed there, not here: this runs before a forward's compile, on the critical path."""
    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    if store is None or tc is None or not store.writable:
        return
    job = backward_job(*call)
    if job is None:
        return
    server = _get_server()
    if server is None:
        return
    sent = (tc.id, repr(job))
    with _lock:
        if sent in _sent or server is not _server:  # (replaced meanwhile: the next call sends it)
            return
        _sent.add(sent)
    n = children(kernels)
    # No targets: each worker lists the job's kernels and takes those nobody holds or has.
    task = CompileTask(jobs=(job,), ahead=True, toolchain=tc.id, fork=n)
    if not server.submit(task):
        with _lock:
            _sent.discard(sent)  # (the server is gone: a later call or miss hands it over)
        return
    log.info("fa4cache: compiling the backward kernels ahead in %d background worker(s)", n)


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


def note_started(kind: str, digest: str) -> None:
    """A worker of this process started compiling ``digest`` (counted when it is loaded here)."""
    with _lock:
        _launched.setdefault(digest, time.perf_counter())


# ------------------------------------------------------------------ the compile server


def children(kernels: int) -> int:
    """Workers for ``kernels`` kernels: this process's share of the node's CPU cores
    (``LOCAL_WORLD_SIZE`` processes, as torchrun sets it, share them)."""
    import os

    per_node = max(int(os.environ.get("LOCAL_WORLD_SIZE") or 1), 1)
    return max(1, min(kernels, cpu_count() // per_node))


def server_env() -> dict[str, str] | None:
    """What the server compiles for: this process's target and store (asks the GPU)."""
    store = runtime.installed_store()
    env = compile_server.target_env()
    if store is None or not store.writable or env is None:
        return None
    return store_env(store, env)


def store_env(store: Any, target: dict[str, str]) -> dict[str, str]:
    """``target``'s variables plus what a server needs to compile into ``store``: its path
    and, in a job, the job's leases."""
    env = dict(target)
    env["FA4CACHE_DIR"] = str(store.root) if store.root is not None else ""
    if store.remote is not None:  # in a job: the server compiles under the job's leases too
        env.update(store.remote.worker_env())
    return env


def _get_server(
    env: dict[str, str] | None = None, *, configure: bool = True
) -> compile_server.CompileServer | None:
    """This process's compile server (started, GPU-blind, if there is none); with
    ``configure``, told ``env`` (default: this process's target and store,
    :func:`server_env`), or None when there is none to tell."""
    global _server
    own = configure and env is None  # this process's own target (the miss path)
    if own:
        env = server_env()
    if configure and env is None:
        return None
    with _lock:
        if own and _server is not None and not _server.compiles_for(env):  # type: ignore[arg-type]
            # Configured early for another target (another device of this process): a server
            # refuses tasks of another toolchain, so a new one compiles for this one. (A warm
            # plan for another target, background.start, keeps this server and gets its own.)
            log.info("fa4cache: the compile server compiles for another target; starting one for this one")
            _server.close(wait=False)
            _server = None
            _sent.clear()
        if _server is None or _server.proc.poll() is not None:
            _sent.clear()  # (a new server has been handed nothing)
            store = runtime.installed_store()
            if store is None or not store.writable:
                return None
            _server = compile_server.CompileServer(None, on_started=note_started, keep_results=False)
        server = _server
    if env is not None:
        server.configure(env)
    return server


def start_server_at_install() -> None:
    """On a GPU host with an empty store, start the compile server now: it imports FA4 while
    this process goes on with its own imports and setup, so that a cold first step never
    waits for it. A store that already holds kernels (a restart, a warmed or bundle-fed
    node) starts none here: a server costs a process
    with torch and FA4 imported (about 0.8 GB) beside each rank, and the first miss, if one
    comes, starts it then. CPU-only processes start it at a miss too."""
    from fa4cache.arch import cuda_devices_visible

    if _server is None and enabled() and cuda_devices_visible() and not _store_is_warm():
        server = _get_server(configure=False)
        if server is not None:
            threading.Thread(
                target=_configure_when_cuda_is_up, args=(server,), name="fa4cache-server-target", daemon=True
            ).start()


# How often the watcher looks whether this process has started CUDA.
CUDA_POLL_SECONDS = 0.05


def _configure_when_cuda_is_up(server: compile_server.CompileServer) -> None:
    """Tell ``server`` this process's target as soon as this process has started CUDA itself
    (its model moved to the GPU, its first tensors made): the server then installs the store and
    is ready before the first step's miss, which would otherwise wait for that (about a second
    on a busy host). Asking never starts CUDA here: until this process has, the first miss
    tells the server (:func:`_get_server`). The target is read from this thread's current device;
    a miss in a process whose device differs replaces the server (:func:`_get_server`). Not in a
    job with a job-wide tier (its leases come with the process group, later)."""
    import sys

    store = runtime.installed_store()
    if store is None or store.remote is not None:
        # In a job with a job-wide tier the server's configuration carries the job's leases,
        # which exist once the process group is up: the first miss tells it, as before.
        return
    while server.proc.poll() is None and not server.configured and server is _server:
        torch = sys.modules.get("torch")
        # Not a torch still being imported (by this process's main thread, at this moment).
        importing = torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False)
        try:
            up = not importing and torch.cuda.is_initialized()
        except Exception:  # torch.cuda half imported: ask again
            up = False
        if up:
            try:
                env = server_env()
            except Exception as e:  # asking the GPU failed: the miss configures it
                log.debug("fa4cache: compile server target not known early: %s", e)
                return
            if env is not None:
                server.configure(env)
            return
        time.sleep(CUDA_POLL_SECONDS)


def _store_is_warm() -> bool:
    # Any kernel at all: the job's toolchain id is not asked for here, since computing it
    # before FA4 is imported and patched would fix an id the compiles then disagree with. A
    # store holding only another toolchain's kernels (FA4 upgraded) starts its server at
    # the first miss instead: that step waits for the server's import once.
    store = runtime.installed_store()
    return store is not None and next(iter(store.entries()), None) is not None


def _after_forward(*, compiled: bool) -> None:
    global _quiet_forwards
    _quiet_forwards = 0 if compiled else _quiet_forwards + 1
    if _quiet_forwards >= RETIRE_AFTER:
        _retire_server()


def _misses() -> float:
    store = runtime.installed_store()
    return store.counters.counted("misses") if store is not None else 0


def _retire_server() -> None:
    """The server leaves once its children are done (a later miss starts another)."""
    global _server, _quiet_forwards
    with _lock:
        server, _server = _server, None
        _sent.clear()
    _quiet_forwards = 0
    if server is not None:
        server.close(wait=False)


events.wrap_forward(wrap_forward)
