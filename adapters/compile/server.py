"""Compile servers, seen from the parent: start, hand tasks, collect results, reap.

A server (:mod:`fa4cache.adapters.compile.worker`) cross-compiles on the CPU: it starts with
``CUDA_VISIBLE_DEVICES=""`` and the target arch and SM count of the kernels the parent
runs, so it never holds a GPU and its kernels carry the parent's toolchain. It imports
FA4 once and forks a child per unit of work, so N kernels in flight cost one import, not
N. It dies with the parent (``PR_SET_PDEATHSIG`` plus a parent-pid check in the server),
its children with it; on a normal exit the parent ends idle servers and lets busy ones
finish their kernels (a kernel half-compiled is a kernel lost), except a server doing
speculative work (a model's kernel set, started at model build: ``finish_at_exit``), which
is killed, so that an exit never waits on compiles nobody asked for. ``PR_SET_PDEATHSIG`` fires
when the *thread* that started the server ends, so servers are started from the thread
calling FA4 (the parent-pid check covers the rest).
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fa4cache.adapters.compile.task import PARENT_ENV, CompileTask, encode_task

from fa4cache.aot.plan import Target
from fa4cache.arch import (
    ARCH_ENV,
    ARCH_VAR,
    DSL_ARCH_VAR,
    NUM_SMS_VAR,
    cross_compile_env,
    num_sms_or_none,
    resolved_arch,
)

log = logging.getLogger(__name__)

TARGET_VARS = (ARCH_VAR, DSL_ARCH_VAR, NUM_SMS_VAR)
_live: set[CompileServer] = set()
_live_lock = threading.Lock()


def process_target() -> Target | None:
    """This process's target: its arch and SM count (:mod:`fa4cache.arch`: the GPU's, else
    the cross-compile target's); None when unknown."""
    arch, num_sms = resolved_arch(), num_sms_or_none()
    if arch is None or not num_sms or f"sm_{arch}" not in ARCH_ENV:
        return None
    return Target(f"sm_{arch}", num_sms)


def target_env() -> dict[str, str] | None:
    """Environment that makes a GPU-blind worker compile this process's kernels
    (:func:`process_target`); None when the target is unknown."""
    target = process_target()
    return None if target is None else cross_compile_env(target.arch, target.num_sms)


class CompileServer:
    """One compile server process. ``on_started(kind, digest)`` is called (from a reader
    thread) as one of its children starts compiling a kernel, ``on_result(result)`` as one
    reports."""

    def __init__(
        self,
        env: dict[str, str] | None,
        *,
        on_started: Callable[[str, str], None] | None = None,
        keep_results: bool = True,
        on_result: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """``env``: the target and store (:func:`target_env` plus ``FA4CACHE_DIR``); None: the
        server imports FA4 now and waits for :meth:`configure`."""
        full = dict(os.environ)
        if env is None:
            # Imported without a target: the configuration names it (an arch left in this
            # process's environment could differ from the one its GPU has).
            for var in TARGET_VARS:
                full.pop(var, None)
        full["CUDA_VISIBLE_DEVICES"] = ""  # GPU-blind: never a CUDA context in a worker
        full["FA4CACHE_COMPILE_AHEAD"] = "0"  # a worker compiles what it is told, nothing ahead
        full["FA4CACHE_VERIFY_HITS"] = "0"  # nor spot-checks its own loads
        full[PARENT_ENV] = str(os.getpid())
        # -P: the working directory is not put on sys.path (a source checkout there would
        # shadow the installed package, whose fa4cache.adapters lives elsewhere).
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        self.proc = subprocess.Popen(
            [sys.executable, *safe_path, "-m", "fa4cache.adapters.compile.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full,
        )
        self.started_at = time.perf_counter()
        self._send_lock = threading.Lock()
        self.busy = 0
        # False: speculative work nobody in this process waits for (a model's kernel set,
        # started at model build): killed at exit instead of finished, so that a script
        # that builds a model and ends does not wait on compiles it never asked for.
        self.finish_at_exit = True
        self.results: collections.deque[dict[str, Any]] = collections.deque()
        self._result = threading.Condition()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._on_started = on_started
        self._keep_results = keep_results  # False: fire and forget (results only logged)
        self._on_result = on_result  # called with each result, from the reader thread
        # A task's own listener (by its tag), called with each of its children's results.
        self._listeners: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.env: dict[str, str] | None = None  # the configuration sent: target and store
        threading.Thread(target=self._read_stdout, name="fa4cache-worker-out", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="fa4cache-worker-err", daemon=True).start()
        with _live_lock:
            _live.add(self)
        self.configured = False
        if env is not None:
            self.configure(env)

    def configure(self, env: dict[str, str]) -> None:
        """Tell the server the target and store it compiles for (once)."""
        with self._send_lock:  # held until it is sent: no task can reach the server first
            if self.configured:
                return
            self.configured = True
            self.env = dict(env)
            self._write({"env": env})

    def compiles_for(self, env: dict[str, str]) -> bool:
        """Whether this server compiles for ``env``'s target and store (unconfigured: any)."""
        if self.env is None:
            return True
        names = (*TARGET_VARS, "FA4CACHE_DIR")
        return all(self.env.get(k) == env.get(k) for k in names)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == "READY":
                log.debug(
                    "fa4cache: compile server %d ready in %.2f s",
                    self.pid,
                    time.perf_counter() - self.started_at,
                )
            elif line.startswith("STARTED "):
                _, kind, digest = line.split(" ", 2)
                if self._on_started is not None:
                    self._on_started(kind, digest)
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
                _log_result(result)
                tag = result.get("task")
                for listener in (self._on_result, self._listeners.get(tag) if tag else None):
                    if listener is None:
                        continue
                    try:
                        listener(result)
                    except Exception as e:  # a listener's trouble must not stop the reader
                        log.debug("fa4cache: compile server result listener failed: %s", e)
                with self._result:
                    if self._keep_results:
                        self.results.append(result)
                    self.busy -= 1
                    self._result.notify_all()
        with self._result:
            self.busy = 0
            self._result.notify_all()
        with _live_lock:
            _live.discard(self)
        # The server is gone: a task still waiting for children's results gets none.
        for tag, listener in list(self._listeners.items()):
            try:
                listener({"error": "the compile server exited", "jobs": [], "task": tag, "ended": True})
            except Exception as e:
                log.debug("fa4cache: compile server result listener failed: %s", e)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode(errors="replace").rstrip("\n"))

    def submit(self, task: CompileTask, on_result: Callable[[dict[str, Any]], None] | None = None) -> bool:
        """Hand ``task`` to ``task.fork`` children; one result comes per child, also to
        ``on_result`` (from the reader thread; needs ``task.tag``). False: the server is gone."""
        if on_result is not None:
            if task.tag is None:
                raise ValueError("CompileServer.submit: a task with a listener needs a tag")
            self._listeners[task.tag] = on_result
        with self._result:
            self.busy += task.fork
        if not self._send(task):
            with self._result:
                self.busy = 0
            return False
        return True

    def _send(self, message: CompileTask | dict[str, Any]) -> bool:
        with self._send_lock:
            return self._write(message)

    def _write(self, message: CompileTask | dict[str, Any]) -> bool:
        """Write one message (the caller holds ``_send_lock``); False: the server is gone."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(encode_task(message))
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:  # died, or closed (retired): left to the miss path
            log.debug("fa4cache: compile server %d is gone (%s)", self.pid, e)
            return False
        return True

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """The next child's result (waits); an ``error`` entry if the server died first."""
        with self._result:
            self._result.wait_for(lambda: self.results or self.proc.poll() is not None, timeout)
            if self.results:
                return self.results.popleft()
        self.proc.wait()
        tail = " | ".join(list(self.stderr_tail)[-5:])
        return {"error": f"compile worker exited with {self.proc.returncode}: {tail[-600:]}", "jobs": []}

    def close(self, *, wait: bool = True) -> None:
        """Let the worker finish what it was given, then end it (stdin's end is its signal)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        if wait:
            self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _log_result(result: dict[str, Any]) -> None:
    if result.get("error"):
        log.debug("fa4cache: compile worker failed: %s", result["error"])
    for kind, t0, t1 in result.get("spans", {}).values():
        log.debug("fa4cache: compile worker %s compiled %s in %.2f s", result.get("pid"), kind, t1 - t0)


@atexit.register
def _reap() -> None:
    # Busy workers finish their kernel (it lands in the store for the next process); idle
    # ones (a server still importing FA4, say) end at once: an exit never waits on them.
    with _live_lock:
        workers = list(_live)
    busy = [w for w in workers if w.busy > 0 and w.finish_at_exit]
    for w in workers:
        if w in busy:
            w.close(wait=False)
        else:
            w.kill()
    for w in busy:
        try:
            w.proc.wait()
        except KeyboardInterrupt:
            w.kill()


def can_fork() -> bool:
    """Whether workers may be forked from this process (sharing its imports): Linux, and no
    GPU here, so no CUDA state a child could inherit half-made."""
    from fa4cache.adapters.fa4.cross_compile import gpu_present

    return sys.platform.startswith("linux") and not gpu_present()
