"""What ``fa4cache warm`` is doing while it works, on stderr (stdout keeps the table)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from .common import plural

HEARTBEAT_S = 15.0  # without a terminal: a line at least this often while compiling


class Progress:
    """On a terminal one line redrawn, else one line per kernel stored, so that a one-spec
    warm of a minute does not look hung. Kernels are seen as they land in the store (a thread
    lists its entries each second), which works the same for -j workers and for -j 1."""

    def __init__(self, cache_dir: str, n_specs: int, *, quiet: bool, what: str = "spec") -> None:
        from fa4cache.store.paths import Layout

        self.what = what
        self.layout = Layout(Path(cache_dir))
        self.n_specs = n_specs
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.specs_done = 0
        self.kernels: set[Any] = set()
        self._before: set[Any] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()

    def __enter__(self) -> Progress:
        if not self.quiet:
            self._before = self._entries()
            sys.stderr.write(
                f"warming {plural(self.n_specs, self.what)}: one line per kernel stored\n"
                if not self.tty
                else ""
            )
        return self

    def _entries(self) -> set[Any]:
        return {(e.ref.kind, e.ref.digest) for e in self.layout.iter_entries()}

    def start(self) -> None:
        """Start watching; called once the -j workers are forked (a fork copies threads badly)."""
        if self.quiet or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="fa4cache-warm-progress", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        quiet_since = time.perf_counter()
        while not self._stop.wait(1.0):
            n = len(self.kernels)
            self._poll()
            if len(self.kernels) != n:
                quiet_since = time.perf_counter()
            elif not self.tty and time.perf_counter() - quiet_since >= HEARTBEAT_S:
                # A long kernel (a minute on a busy CPU) must not look like a hang in a log.
                sys.stderr.write(f"  still compiling ({self._elapsed()})\n")
                sys.stderr.flush()
                quiet_since = time.perf_counter()

    def _poll(self) -> None:
        try:
            new = self._entries() - self._before - self.kernels
        except OSError:
            return
        for kind, _ in sorted(new):
            self.kernels.add((kind, _))
            if not self.tty:
                sys.stderr.write(f"  stored {kind} kernel ({len(self.kernels)} so far, {self._elapsed()})\n")
        self._draw()

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self._t0:.0f} s"

    def _draw(self) -> None:
        if self.tty and not self.quiet:
            done = int(30 * self.specs_done / self.n_specs)
            sys.stderr.write(
                f"\r[{'#' * done}{'.' * (30 - done)}] {self.specs_done}/{self.n_specs} {self.what}s, "
                f"{plural(len(self.kernels), 'kernel')} compiled, {self._elapsed()}  "
            )
        sys.stderr.flush()

    def spec_done(self, spec: Any) -> None:
        self.specs_done += 1
        self._draw()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.quiet:
            self._poll()
            if self.tty:
                sys.stderr.write("\n")
