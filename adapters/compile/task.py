"""A compile task: what a compile server's workers are asked to compile, and how.

Tasks cross a pipe to the server (pickled) and are copied into each forked worker, so a task
holds plain data and the jobs (:class:`~fa4cache.adapters.compile.kernel_set.SpecJob`,
:class:`~fa4cache.adapters.compile.kernel_set.CallJob`) that rebuild a step's calls there.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CompileTask:
    jobs: tuple[Any, ...]
    # Only these kernel digests (warm compiling again what it found corrupt); None: all.
    targets: frozenset[str] | None = None
    # After its own share, wait for the kernels other processes were compiling and compile
    # any they left (a holder that died): warm does; compile-ahead does not.
    wait: bool = False
    # Counted as ahead-of-need compiles (``ahead_compiles`` in stats).
    ahead: bool = False
    # The toolchain id the parent compiles for; a server that computes another refuses.
    toolchain: str | None = None
    # How many workers the server forks for it (each takes the kernels nobody holds yet).
    fork: int = 1
    # Compile ``targets`` again into a scratch store and compare the bytes with the store's
    # (FA4CACHE_VERIFY_HITS, :mod:`.rebuild_check`); nothing is published.
    rebuild: bool = False
    # Echoed in each child's result: a server shared by several tasks hands each result to
    # the listener its task was submitted with (:meth:`.server.CompileServer.submit`).
    tag: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(self.jobs))
        if self.fork < 1:
            raise ValueError(f"CompileTask.fork must be at least 1, got {self.fork}")

    def only(self, digests: Iterable[str]) -> CompileTask:
        return dataclasses.replace(self, targets=frozenset(digests))

    def forked(self, n: int) -> CompileTask:
        return dataclasses.replace(self, fork=max(1, n))


# The wire between a parent and its compile server: each message is a length and a pickle.
# The server is a child of the same user running the same code, over anonymous pipes only.
PARENT_ENV = "FA4CACHE_WORKER_PARENT"  # the pid a server dies with
_HEADER = struct.Struct("<Q")


def encode_task(task: Any) -> bytes:
    body = pickle.dumps(task)
    return _HEADER.pack(len(body)) + body


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


def cpu_count() -> int:
    """The cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Kernels of one spec: the forward, and with the backward its preprocess, the backward
# and two postprocess conversions (dQ, dK/dV). Only sizes the default pool.
KERNELS_PER_SPEC = {False: 1, True: 5}


def default_jobs(specs: list[Any]) -> int:
    """As many workers as CPU cores and kernels (``specs``: :class:`~fa4cache.aot.spec.KernelSpec`)."""
    kernels = sum(KERNELS_PER_SPEC[s.backward] for s in specs)
    return max(1, min(cpu_count(), kernels))
