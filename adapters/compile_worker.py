"""A compile worker process: ``python -m fa4cache.adapters.compile_worker``.

Started by :mod:`.compile_pool` with ``CUDA_VISIBLE_DEVICES=""`` and the parent's target
arch, it imports FA4 once, says ``READY``, then runs tasks read from stdin (a length
and a pickle each) until stdin ends. A task names jobs (:mod:`.kernel_set`); the worker
lists their kernels and takes them one at a time through the per-key lock (``try_lock``):
a kernel another process is compiling is left to it, so N workers and any number of
training processes compile each kernel once. Output lines: ``READY``, ``STARTED <kind>
<digest>``, ``RESULT <json>``.

It never outlives its parent: ``PR_SET_PDEATHSIG`` (Linux) kills it with the parent, and a
watchdog thread exits when the parent pid changes (a parent killed before the signal
was armed, or another OS).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
import threading
import time
from typing import Any

PARENT_ENV = "FA4CACHE_WORKER_PARENT"
_HEADER = struct.Struct("<Q")


def die_with_parent() -> None:
    parent = int(os.environ.get(PARENT_ENV) or 0)
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent and os.getppid() != parent:
        os._exit(0)  # the parent died before the signal was armed

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(0)

    if parent:
        threading.Thread(target=watch, name="fa4cache-parent-watch", daemon=True).start()


def read_task(fd: int = 0) -> Any | None:
    head = _read_exact(fd, _HEADER.size)
    if head is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def encode_task(task: Any) -> bytes:
    body = pickle.dumps(task)
    return _HEADER.pack(len(body)) + body


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# Longest first: with several workers the long kernels start at once.
_ORDER = {"fwd": 0, "bwd": 1}


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Compile the kernels of ``task["jobs"]`` (only ``task["targets"]`` when given) that
    nobody else is compiling; with ``task["wait"]``, then wait for the ones others took and
    compile any they left (a holder that died)."""
    from fa4cache.store import installed as runtime
    from fa4cache.store.paths import EntryRef

    from . import kernel_set

    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    assert store is not None and tc is not None
    want = task.get("toolchain")
    if want and want != tc.id:
        return {"error": f"toolchain {tc.id} is not the parent's {want}: not compiling", "jobs": []}
    targets = set(task["targets"]) if task.get("targets") is not None else None
    jobs = task["jobs"]
    planned: list[list[str]] = []
    errors: dict[int, str] = {}
    todo: list[tuple[int, Any]] = []
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        try:
            kernels = kernel_set.plan(job.run)
        except Exception as e:
            errors[i] = f"{type(e).__name__}: {e}"
            kernels = []
        planned.append([k.digest for k in kernels])
        for k in kernels:
            if k.digest not in seen and (targets is None or k.digest in targets):
                seen.add(k.digest)
                todo.append((i, k))
    todo.sort(key=lambda t: _ORDER.get(t[1].kind, 2))
    compiled: dict[str, float] = {}
    left: list[tuple[int, Any]] = []

    def present(k: Any) -> bool:
        return store.layout.sidecar_path(EntryRef(tc.id, k.kind, k.digest)).exists()

    def compile_it(i: int, k: Any, held: Any) -> None:
        _say(f"STARTED {k.kind} {k.digest}")
        # What the store counts as this kernel's compile seconds (miss to publish), so that
        # warm's table and `fa4cache stats` give one number.
        before = store.counters.values.get("compile_seconds", 0.0)
        try:
            outcome = kernel_set.compile_one(jobs[i].run, k, held)
        except Exception as e:
            errors.setdefault(i, f"{type(e).__name__}: {e}")
            return
        if outcome == "compiled":
            compiled[k.digest] = store.counters.values.get("compile_seconds", 0.0) - before
            if task.get("ahead"):
                store.counters.add("ahead_compiles")

    for i, k in todo:
        if present(k):
            continue
        try:
            held = store.locks.try_lock(k.digest)
        except OSError:
            held = None  # unlockable: compile without single-flight, as the miss path would
        else:
            if held is None:
                left.append((i, k))  # another process is compiling it
                continue
        compile_it(i, k, held)
    if task.get("wait"):
        for i, k in left:
            if not present(k):
                compile_it(i, k, None)  # waits on the holder's lock, then loads or compiles
    store.counters.flush()
    return {"jobs": planned, "compiled": compiled, "errors": {str(i): e for i, e in errors.items()}}


def main() -> int:
    die_with_parent()
    import logging
    import warnings

    # FA4 and the DSL warn about their own deprecations on every import; not the user's concern here.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*cannot be converted to a JitArgument.*")
    logging.basicConfig(level=logging.WARNING, format="fa4cache worker %(process)d: %(message)s")
    from .flash_attn import install

    install()
    import flash_attn.cute.interface  # noqa: F401  (imported now, so that a task starts compiling at once)

    _say("READY")
    while True:
        task = read_task()
        if task is None:
            # Skip the interpreter's teardown of torch and the DSL (seconds on a busy host): the
            # counters and use records are what needs writing.
            from fa4cache.store import installed as runtime

            store = runtime.installed_store()
            if store is not None:
                store.flush_touches()
                store.counters.flush()
            sys.stdout.flush()
            os._exit(0)
        try:
            result = run_task(task)
        except Exception as e:
            result = {"error": f"{type(e).__name__}: {e}", "jobs": []}
        _say("RESULT " + json.dumps(result))


if __name__ == "__main__":
    raise SystemExit(main())
