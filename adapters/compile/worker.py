"""A compile server process: ``python -m fa4cache.adapters.compile.worker``.

Started by :mod:`fa4cache.adapters.compile.server` with ``CUDA_VISIBLE_DEVICES=""``, it imports torch and FA4
at once, then reads its configuration from stdin: the parent's target arch, SM count and
store (a parent may start it before it knows them, e.g. at ``fa4cache.install()``, so that
the import, seconds long, runs beside its own). FA4 reads the arch at its first call and
the DSL's latched target is reset, so a configuration after the import is the same as
one before it. Then it installs the store, says ``READY`` and reads tasks from stdin (a
length and a pickle each) until stdin ends. For each task it *forks* ``task.fork`` children (default
1): a child starts compiling within milliseconds, with FA4 already imported, where a fresh
worker would first pay the import (seconds; 10 s and more on a busy GPU host). The server
never touches a GPU or starts a thread before it forks, so forking is safe.

A task names jobs (:mod:`fa4cache.adapters.compile.kernel_set`); each child lists their kernels and takes them one
at a time through the per-key lock (``try_lock``): a kernel another process is compiling
is left to it, so any number of children, servers and training processes compile each
kernel once. Output lines: ``READY``, ``STARTED <kind> <digest>``, ``RESULT <json>`` (one
per child); each is one ``write`` to the pipe, so that children's lines never interleave.

Nothing outlives the parent: ``PR_SET_PDEATHSIG`` (Linux) kills the server with the parent
and each child with the server, and a watchdog exits when the parent pid changes (a
parent killed before the signal was armed, or another OS). On stdin's end the server
waits for its children (a kernel half-compiled is a kernel lost), then exits.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fa4cache.adapters.compile.task import PARENT_ENV, CompileTask, read_task

from fa4cache import patched_code

T = TypeVar("T")


def die_with_parent(*, watch: bool = True) -> None:
    """Die with the process named by ``FA4CACHE_WORKER_PARENT``. ``watch=False``: no
    watchdog thread (the server forks, and polls its parent itself)."""
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

    def watchdog() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(0)

    if parent and watch:
        threading.Thread(target=watchdog, name="fa4cache-parent-watch", daemon=True).start()


def _say(line: str, fd: int = 1) -> None:
    # One write per line, without Python's buffered stdout (and its lock, which a fork
    # could copy half-held): lines of several processes on one pipe stay whole.
    data = (line + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


# Longest first: with several workers the long kernels start at once.
_ORDER = {"fwd": 0, "bwd": 1}


def run_task(task: CompileTask) -> dict[str, Any]:
    """:func:`_run_task`: a worker compiles on purpose, ahead of need, never an unexpected
    compile (``FA4CACHE_EXPECT_WARM``)."""
    from fa4cache.warmth import expect_warm

    with expect_warm("off"):
        if task.rebuild:
            from fa4cache.adapters.compile.rebuild_check import rebuild_in_worker

            return rebuild_in_worker(task, _run_task)
        return _run_task(task)


def _run_task(task: CompileTask) -> dict[str, Any]:
    """Compile the kernels of ``task.jobs`` (only ``task.targets`` when given) that nobody
    else is compiling; with ``task.wait``, then wait for the ones others took and compile
    any they left (a holder that died)."""
    from fa4cache.adapters.compile import kernel_set

    from fa4cache.store import runtime
    from fa4cache.store.paths import EntryRef

    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    assert store is not None and tc is not None
    want = task.toolchain
    if want and want != tc.id:
        return {"error": f"toolchain {tc.id} is not the parent's {want}: not compiling", "jobs": []}
    targets = task.targets
    jobs = task.jobs
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
    # When each kernel this process compiled started and ended (wall clock), for a timeline.
    spans: dict[str, tuple[str, float, float]] = {}
    left: list[tuple[int, Any]] = []

    def present(k: Any) -> bool:
        return store.has(EntryRef(tc.id, k.kind, k.digest))

    def compile_it(i: int, k: Any, held: Any) -> None:
        _say(f"STARTED {k.kind} {k.digest}")
        # What the store counts as this kernel's compile seconds (miss to publish), so that
        # warm's table and `fa4cache stats` give one number.
        before = store.counters.counted("compile_seconds")
        t0 = time.time()
        try:
            outcome = kernel_set.compile_one(jobs[i].run, k, held)
        except Exception as e:
            errors.setdefault(i, f"{type(e).__name__}: {e}")
            return
        if outcome == "compiled":
            compiled[k.digest] = store.counters.counted("compile_seconds") - before
            spans[k.digest] = (k.kind, t0, time.time())
            if task.ahead:
                store.counters.add("ahead_compiles")

    for i, k in todo:
        if present(k):
            continue
        try:
            # The node's lock, and in a job the job-wide lease: a kernel another node is
            # compiling, or has published, is left to the miss path (which fetches it).
            held = store.locks.try_claim(k.digest)
        except OSError:
            held = None  # unlockable: compile without single-flight, as the miss path would
        else:
            if held is None:
                left.append((i, k))  # another process is compiling it
                continue
        compile_it(i, k, held)
    if task.wait:
        for i, k in left:
            if not present(k):
                compile_it(i, k, None)  # waits on the holder's lock, then loads or compiles
    store.counters.flush()
    return {
        "jobs": planned,
        "compiled": compiled,
        "errors": {str(i): e for i, e in errors.items()},
        "pid": os.getpid(),
        "spans": spans,
    }


def fork_child(task: CompileTask, *, progress: bool = True) -> tuple[int, int]:
    """Fork a child that runs ``task`` and writes its result (JSON) to a pipe: its pid and
    the pipe's read end. ``progress``: its ``STARTED`` lines go to stdout (a server's pipe;
    not a CLI's output). Call from a process that has installed the store and imported FA4,
    holds no GPU and no key lock, and runs one thread (what a fork copies is then whole).
    The child dies with this process."""
    from fa4cache.store import runtime

    # The run-time patch verdict, taken here (a memo after the first): the child inherits it
    # instead of walking for itself (patched_code resets its locks in a child, so a warm-up
    # thread walking at the fork costs the child nothing but that walk).
    patched_code.found_once()
    parent = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        return pid, r
    code = 0  # the child: never returns
    try:
        os.close(r)
        if not progress:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.close(null)
        os.environ[PARENT_ENV] = str(parent)
        os.environ["FA4CACHE_COMPILE_AHEAD"] = "0"
        die_with_parent()
        store = runtime.installed_store()
        if store is not None:  # counters are per process: the parent's would not persist here
            store.counters.fresh()
        out = run_task(task)
        if store is not None:
            store.flush_touches()
    except BaseException as e:
        out, code = {"error": f"{type(e).__name__}: {e}", "jobs": []}, 1
    try:
        _say(json.dumps(out), w)
    finally:
        os._exit(code)


def collect(pid: int, r: int) -> dict[str, Any]:
    """A forked child's result, once it has ended."""
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    try:
        return json.loads(data)
    except ValueError:
        return {"error": f"compile worker {pid} ended without a result (status {status})", "jobs": []}


def checked_again_if_imported(step: Callable[[], T]) -> T:
    """``step()``; if it imported code, the run-time patch verdict is taken again (judging only
    what changed: milliseconds), so that the children forked after it inherit a verdict that
    saw that code."""
    known = list(sys.modules)  # names, in order: an import and a removal may leave the count
    out = step()
    if list(sys.modules) != known:
        patched_code.forget()
        patched_code.found_once()
    return out


def serve() -> None:
    """Read tasks from stdin and fork their children until stdin ends and every child has
    reported; one thread throughout (children are forked from it)."""
    import selectors

    # Everything imported so far (torch, FA4, the DSL: most of the heap) moves out of the
    # collector's reach: a child's collections then neither scan it nor write to its pages,
    # which the fork shares (each write would copy a page). A child's compile is mostly the
    # DSL tracing Python, which collects often.
    gc.freeze()
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ, None)
    children: dict[int, tuple[int, str | None]] = {}  # read end -> pid, its task's tag
    parent = int(os.environ.get(PARENT_ENV) or 0)
    open_stdin = True
    while open_stdin or children:
        if parent and os.getppid() != parent:
            os._exit(0)  # the parent is gone (another OS, or a signal not armed)
        for key, _ in sel.select(timeout=0.5):
            if key.fd == 0:
                # Unpickling the task may import code (a mask's module) that patches FA4.
                task = checked_again_if_imported(read_task)
                if task is None:
                    sel.unregister(0)
                    open_stdin = False
                    continue
                for _ in range(task.fork):
                    try:
                        pid, r = fork_child(task)
                    except OSError as e:  # out of processes or memory: one result says so
                        out = {"error": f"cannot fork: {e}", "jobs": [], "task": task.tag}
                        _say("RESULT " + json.dumps(out))
                        continue
                    children[r] = (pid, task.tag)
                    sel.register(r, selectors.EVENT_READ, None)
            else:
                sel.unregister(key.fd)
                pid, tag = children.pop(key.fd)
                out = collect(pid, key.fd)
                out["task"] = tag  # also for a child that died without a result
                _say("RESULT " + json.dumps(out))


def configure(env: dict[str, str]) -> None:
    """Take the parent's target (``FLASH_ATTENTION_ARCH``, ``CUTE_DSL_ARCH``,
    ``FLASH_ATTENTION_NUM_SMS``) and store (``FA4CACHE_DIR``), with FA4 already imported."""
    os.environ.update(env)
    from fa4cache.arch import DSL_ARCH_VAR

    if env.get(DSL_ARCH_VAR):
        # The DSL latched its target when it was imported (no GPU here: its default):
        # re-latch it, as QuACK's own compile pool does.
        from cutlass.cutlass_dsl import CuTeDSL

        CuTeDSL._get_dsl().envar.arch = env[DSL_ARCH_VAR]


def main() -> int:
    die_with_parent(watch=False)
    import logging
    import warnings

    # FA4 and the DSL warn about their own deprecations on every import; not the user's concern here.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*cannot be converted to a JitArgument.*")
    logging.basicConfig(level=logging.WARNING, format="fa4cache worker %(process)d: %(message)s")
    import flash_attn.cute.interface  # noqa: F401  (imported once, here: every child has it)

    # What unpickling a task imports (its jobs' classes): imported now, a task imports nothing
    # and the patch check below need not run again on the critical path (serve).
    importlib.import_module("fa4cache.adapters.compile.kernel_set")

    # The run-time patch check (fa4cache.patched_code), once here and before the configuration
    # comes (it comes at the parent's first miss at the latest, and the check is a walk of every
    # FA4, DSL and QuACK function: about a second on a busy host): the forked children inherit
    # the verdict instead of each paying for it before its kernel's key. Whatever install()
    # or a task imports later is checked again, against this walk's snapshot (below, and serve).
    patched_code.runtime_patches(snapshot=True)
    patched_code.found_once()
    config = read_task()
    if config is None:
        os._exit(0)  # the parent left before it knew what to compile
    configure(config["env"])
    from fa4cache.adapters.patch import install

    checked_again_if_imported(install)  # (a remote tier named by FA4CACHE_REMOTE_TIER is the user's code)
    _say("READY")
    serve()
    # Skip the interpreter's teardown of torch and the DSL (seconds on a busy host): the
    # children wrote their counters and use records.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
