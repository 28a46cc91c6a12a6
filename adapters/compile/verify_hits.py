"""``FA4CACHE_VERIFY_HITS``: a sample of the kernels a job loads from the store is compiled
again in the background and compared byte for byte.

A key binds an entry to what its walker valued (:mod:`fa4cache.identity`); a hole nobody has
thought of yet files one code's kernel under another code's key, and the load looks like any
other hit. Compiles are deterministic, so a rebuild finds it: with probability
``FA4CACHE_VERIFY_HITS`` per disk or remote hit, the call that loaded the kernel (FA4's
forward or backward, its tensors as layouts, its ``mask_mod`` / ``score_mod`` by name and
key, as compile-ahead sends it) goes to this process's own compile server
(:mod:`.server`), whose child compiles the kernel into a scratch store and compares
(:func:`fa4cache.adapters.compile.rebuild_check.rebuild_in_worker`). An entry that differs
is quarantined, counted (``verify_mismatches`` in ``fa4cache stats``) and warned about here,
once per kernel, naming its kind and the code's qualified name. A kernel whose call cannot
travel (a callable no other process can find by name) falls back to the spec its sidecar
records (``fa4cache warm``'s), else it is not checked.

Off (the default) nothing here is registered: no listener, no entry-point wrapper, no
server; the hit path is the one without this module.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from fa4cache.adapters.compile import kernel_set
from fa4cache.adapters.compile import server as compile_server
from fa4cache.adapters.compile.kernel_set import CallJob, SpecJob
from fa4cache.adapters.compile.task import CompileTask
from fa4cache.adapters.fa4 import events
from fa4cache.adapters.fa4.events import MissEvent, MissStage

from fa4cache.settings import setting
from fa4cache.store import runtime

log = logging.getLogger(__name__)

_tl = threading.local()
_lock = threading.Lock()
_rng = random.Random()
_rate = 0.0
_server: compile_server.CompileServer | None = None
# digest -> (kind, the code's qualified name): what a mismatch's warning names.
_asked: dict[str, tuple[str, str]] = {}
_warned: set[str] = set()


def enable() -> bool:
    """Register the spot-check if ``FA4CACHE_VERIFY_HITS`` asks for it (``fa4cache.install()``
    calls this before FA4 is patched); True when on."""
    global _rate
    rate = float(setting("FA4CACHE_VERIFY_HITS"))
    if rate <= 0.0:
        return False
    _rate = rate
    events.listen(_on_loaded)
    events.wrap_entry(_remember_call)
    return True


def _remember_call(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """FA4's entry point ``name``, remembering its call while it runs (a hit then knows what
    to send to the compile server)."""
    import functools

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        prev = getattr(_tl, "call", None)
        _tl.call = (name, args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            _tl.call = prev

    return call


def _on_loaded(event: MissEvent) -> None:
    if event.stage is not MissStage.LOADED or _rng.random() >= _rate:
        return
    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    if store is None or tc is None or event.ref.toolchain != tc.id:
        return
    with _lock:
        if event.ref.digest in _asked:
            return  # checked once per process
    found = _job(event, store)
    if found is None:
        log.debug(
            "fa4cache: %s hit %s not spot-checked: no call or spec to rebuild it from",
            event.kind,
            event.ref.digest[:16],
        )
        return
    job, qualname = found
    server = _get_server()
    if server is None:
        return
    with _lock:
        _asked[event.ref.digest] = (event.kind, qualname)
    server.submit(
        CompileTask(jobs=(job,), targets=frozenset({event.ref.digest}), toolchain=tc.id, rebuild=True)
    )
    log.info("fa4cache: spot-checking the stored %s kernel of %s by compiling it again", event.kind, qualname)


def _job(event: MissEvent, store: Any) -> tuple[Any, str] | None:
    """What rebuilds the hit's kernel: the entry-point call it was loaded for, else the spec
    its sidecar records; with the qualified name of the code it is the kernel of."""
    call = getattr(_tl, "call", None)
    if call is not None:
        name, args, kwargs = call
        try:
            job = CallJob(name, kernel_set.describe(args), kernel_set.describe(kwargs))
        except TypeError as e:
            log.debug("fa4cache: the call cannot travel to a compile worker: %s", e)
        else:
            return job, _qualname(name, kwargs)
    side = store.read_sidecar(event.ref)
    if side is not None and side.spec is not None:
        return SpecJob(side.spec), f"the fa4cache warm spec {side.spec}"
    return None


def _qualname(entry: str, kwargs: dict[str, Any]) -> str:
    for arg in ("mask_mod", "score_mod"):
        fn = kwargs.get(arg)
        if fn is not None:
            return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    return f"flash_attn.cute.interface.{entry}"


def _get_server() -> compile_server.CompileServer | None:
    """The spot-check's compile server (GPU-blind, this process's target and store)."""
    global _server
    from fa4cache.adapters.compile.ahead import server_env

    with _lock:
        if _server is not None and _server.proc.poll() is None:
            return _server
        env = server_env()
        if env is None:
            return None
        _server = compile_server.CompileServer(env, keep_results=False, on_result=_on_result)
        return _server


def _on_result(result: dict[str, Any]) -> None:
    """A rebuild's outcome (from the server's reader thread)."""
    for digest, outcome in (result.get("verified") or {}).items():
        with _lock:
            kind, qualname = _asked.get(digest, ("?", "?"))
            first = outcome == "different" and digest not in _warned
            _warned.add(digest)
        if first:
            log.warning(
                "fa4cache: STORED KERNEL WAS WRONG: the %s kernel of %s loaded from the store (entry %s) differs "
                "from its rebuild, so its key missed something its code depends on. The entry is quarantined; "
                "this process keeps the kernel it loaded until it restarts. Please report it with "
                "`fa4cache verify --rebuild` output and the code of %s.",
                kind,
                qualname,
                digest[:16],
                qualname,
            )
        elif outcome != "different":
            log.debug("fa4cache: spot-check of %s kernel %s: %s", kind, digest[:16], outcome)
    if result.get("error"):
        log.debug("fa4cache: spot-check failed: %s", result["error"])
