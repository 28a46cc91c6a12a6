"""A compile task: what a compile server's workers are asked to compile, and how.

Tasks cross a pipe to the server (pickled) and are copied into each forked worker, so a task
holds plain data and the jobs (:class:`~fa4cache.adapters.compile.kernel_set.SpecJob`,
:class:`~fa4cache.adapters.compile.kernel_set.CallJob`) that rebuild a step's calls there.
"""

from __future__ import annotations

import dataclasses
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(self.jobs))
        if self.fork < 1:
            raise ValueError(f"CompileTask.fork must be at least 1, got {self.fork}")

    def only(self, digests: Iterable[str]) -> CompileTask:
        return dataclasses.replace(self, targets=frozenset(digests))

    def forked(self, n: int) -> CompileTask:
        return dataclasses.replace(self, fork=max(1, n))
