"""Compile worker processes, seen from the parent: start, hand tasks, collect results, reap.

Workers (:mod:`.compile_worker`) cross-compile on the CPU: they start with
``CUDA_VISIBLE_DEVICES=""`` and the target arch and SM count of the kernels the parent
runs, so they never hold a GPU and their kernels carry the parent's toolchain. They
die with the parent (``PR_SET_PDEATHSIG`` plus a parent-pid watchdog in the worker);
on a normal exit the parent ends idle workers and lets busy ones finish their kernels
(a kernel half-compiled is a kernel lost). ``PR_SET_PDEATHSIG`` fires when the *thread*
that started the worker ends, so workers are started from the thread calling FA4 (the
watchdog covers the rest).
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
from collections.abc import Callable
from typing import Any

from fa4cache.arch import ARCH_ENV, cross_compile_env, num_sms_or_none, resolved_arch

from .compile_worker import PARENT_ENV, encode_task

log = logging.getLogger(__name__)

_live: set[Worker] = set()
_live_lock = threading.Lock()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def target_env(arch: int | None = None, num_sms: int | None = None) -> dict[str, str] | None:
    """Environment that makes a GPU-blind worker compile this process's kernels: its arch
    and SM count (:mod:`fa4cache.arch`: the GPU's, else the cross-compile target's); None
    when unknown."""
    arch = arch if arch is not None else resolved_arch()
    num_sms = num_sms if num_sms is not None else num_sms_or_none()
    if arch is None or not num_sms or f"sm_{arch}" not in ARCH_ENV:
        return None
    return cross_compile_env(f"sm_{arch}", num_sms)


class Worker:
    """One worker process. ``on_started(kind, digest)`` is called (from a reader thread)
    as the worker starts compiling a kernel."""

    def __init__(
        self,
        env: dict[str, str],
        *,
        on_started: Callable[[str, str], None] | None = None,
    ) -> None:
        full = dict(os.environ)
        full.update(env)
        full["CUDA_VISIBLE_DEVICES"] = ""  # GPU-blind: never a CUDA context in a worker
        full["FA4CACHE_COMPILE_AHEAD"] = "0"  # a worker compiles what it is told, nothing ahead
        full[PARENT_ENV] = str(os.getpid())
        # -P: the working directory is not put on sys.path (a source checkout there would
        # shadow the installed package, whose fa4cache.adapters lives elsewhere).
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        self.proc = subprocess.Popen(
            [sys.executable, *safe_path, "-m", "fa4cache.adapters.compile_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full,
        )
        self.ready = threading.Event()
        self.busy = 0
        self.results: collections.deque[dict[str, Any]] = collections.deque()
        self._result = threading.Condition()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._on_started = on_started
        threading.Thread(target=self._read_stdout, name="fa4cache-worker-out", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="fa4cache-worker-err", daemon=True).start()
        with _live_lock:
            _live.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == "READY":
                self.ready.set()
            elif line.startswith("STARTED "):
                _, kind, digest = line.split(" ", 2)
                if self._on_started is not None:
                    self._on_started(kind, digest)
            elif line.startswith("RESULT "):
                with self._result:
                    self.results.append(json.loads(line[len("RESULT ") :]))
                    self.busy -= 1
                    self._result.notify_all()
        self.ready.set()
        with self._result:
            self.busy = 0
            self._result.notify_all()
        with _live_lock:
            _live.discard(self)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode(errors="replace").rstrip("\n"))

    def submit(self, task: dict[str, Any]) -> None:
        with self._result:
            self.busy += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(encode_task(task))
            self.proc.stdin.flush()
        except OSError as e:  # the worker died: its kernels are left to the miss path
            log.debug("fa4cache: compile worker %d is gone (%s)", self.pid, e)
            with self._result:
                self.busy = 0

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """The next task result (waits); an ``error`` entry if the worker died first."""
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


def start(n: int, env: dict[str, str], **kw: Any) -> list[Worker]:
    return [Worker(env, **kw) for _ in range(n)]


@atexit.register
def _reap() -> None:
    # Busy workers finish their kernel (it lands in the store for the next process); idle
    # ones (a standby still importing FA4, say) end at once: an exit never waits on them.
    with _live_lock:
        workers = list(_live)
    busy = [w for w in workers if w.busy > 0]
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
    from .cross_compile import gpu_present

    return sys.platform.startswith("linux") and not gpu_present()


def fork_run(task: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Run ``task`` in ``n`` children forked from this process, which has installed the store
    and imported FA4 (a child starts compiling at once and costs no second import); their
    results, in order. A child dies with this process like a spawned worker."""
    from fa4cache.store import counters
    from fa4cache.store import installed as runtime

    from . import compile_worker

    parent = os.getpid()
    children: list[tuple[int, int]] = []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                os.close(r)
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (progress lines are for a pipe, not the CLI's output)
                os.environ[PARENT_ENV] = str(parent)
                os.environ["FA4CACHE_COMPILE_AHEAD"] = "0"
                compile_worker.die_with_parent()
                store = runtime.installed_store()
                if store is not None:  # counters are per process: the parent's would not persist here
                    store.counters = counters.Counters(store.layout.stats_dir if store.writable else None)
                out = compile_worker.run_task(task)
            except BaseException as e:
                out, code = {"error": f"{type(e).__name__}: {e}", "jobs": []}, 1
            try:
                os.write(w, json.dumps(out).encode())
            finally:
                os._exit(code)
        os.close(w)
        children.append((pid, r))
    results = []
    for pid, r in children:
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        try:
            results.append(json.loads(data))
        except ValueError:
            results.append({"error": f"compile worker {pid} ended without a result ({status})", "jobs": []})
    return results
