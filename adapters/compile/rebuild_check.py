"""Compile stored entries again on this machine and compare the bytes: ``fa4cache verify
--rebuild`` for a whole store, and ``FA4CACHE_VERIFY_HITS`` for a sample of the kernels a job
loads (:func:`rebuild_in_worker`, run by a compile server's child).

The key check binds an entry's bytes to its key; it cannot tell whether whoever filed them
compiled that key honestly. Compiles are deterministic (the same key and toolchain give the
same object file), so a rebuild can: each entry that records the :class:`KernelSpec` it was
compiled for (``fa4cache warm`` records it) is compiled again, in a fresh process, into a
scratch store, and the two copies compared byte for byte. Entries without a spec, or of a
toolchain this environment does not produce, cannot be rebuilt here and are reported so.

A job's hits are rebuilt from the call that loaded them (:mod:`.verify_hits`), in the job's
compile server: a forked child compiles the kernel into a scratch store of its own, the copies
are compared the same way, and an entry that differs is quarantined like a corrupt one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fa4cache.errors import ConfigError
from fa4cache.store import runtime
from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Store

log = logging.getLogger(__name__)

REBUILD_TIMEOUT = 1800.0  # one spec's kernel set, compiled on the CPU


@dataclass
class RebuildReport:
    identical: list[EntryRef] = field(default_factory=list)
    different: list[EntryRef] = field(default_factory=list)
    not_rebuilt: list[tuple[EntryRef, str]] = field(default_factory=list)
    specs: int = 0

    @property
    def clean(self) -> bool:
        return not self.different


def _by_spec(store: Store, only: set[EntryRef] | None) -> tuple[dict[str, list[EntryRef]], list[EntryRef]]:
    """Entries (of ``only``, default all) grouped by the spec their sidecar records; those without one."""
    groups: dict[str, list[EntryRef]] = defaultdict(list)
    bare = []
    for info in store.entries():
        if only is not None and info.ref not in only:
            continue
        side = store.read_sidecar(info.ref)
        if side is None or side.spec is None:
            bare.append(info.ref)
        else:
            groups[json.dumps(side.spec, sort_keys=True)].append(info.ref)
    return dict(groups), bare


def _compile_into(scratch: Path, spec_json: str) -> None:
    """Compile one spec in a fresh process whose only store is ``scratch``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FA4CACHE_")}
    env.update(FA4CACHE_DIR=str(scratch), FA4CACHE_COMPILE_AHEAD="0")
    p = subprocess.run(
        [sys.executable, "-m", "fa4cache.adapters.compile.rebuild_check", spec_json],
        env=env,
        capture_output=True,
        text=True,
        timeout=REBUILD_TIMEOUT,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")


def rebuild(
    store: Store, *, sample: int | None = None, seed: int = 0, only: set[EntryRef] | None = None
) -> RebuildReport:
    """Rebuild the entries (of ``only``, default all) of ``sample`` specs (default all) and
    compare them with ``store``'s."""
    if sample is not None and sample < 1:
        raise ConfigError(f"--rebuild: expected a number of specs >= 1, got {sample}")
    groups, bare = _by_spec(store, only)
    rep = RebuildReport(not_rebuilt=[(r, "records no spec (not compiled by fa4cache warm)") for r in bare])
    keys = sorted(groups)
    if sample is not None and sample < len(keys):
        keys = sorted(random.Random(seed).sample(keys, sample))
    for key in keys:
        rep.specs += 1
        with tempfile.TemporaryDirectory(prefix="fa4cache-rebuild-") as tmp:
            scratch = Path(tmp) / "store"
            try:
                _compile_into(scratch, key)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                rep.not_rebuilt += [(r, f"the rebuild failed: {e}") for r in groups[key]]
                continue
            _compare(store, Store.at(scratch), groups[key], rep)
    return rep


def _compare(store: Store, fresh: Store, refs: list[EntryRef], rep: RebuildReport) -> None:
    for ref in refs:
        mine, again = store.load(ref, remote=False), fresh.load(ref, remote=False)
        if again is None:
            rep.not_rebuilt.append((ref, "this environment compiles another key or toolchain for its spec"))
        elif mine is None:
            rep.not_rebuilt.append((ref, "the entry does not load (see fa4cache verify)"))
        elif mine.data == again.data:
            rep.identical.append(ref)
        else:
            rep.different.append(ref)


MISMATCH = "differs from its rebuild: not what its key compiles to"


def rebuild_in_worker(task: Any, compile_task: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """In a compile server's child: compile ``task.targets`` of ``task.jobs`` again with
    ``compile_task`` (the worker's own task runner) into a scratch store, compare each with
    the installed store's entry, quarantine those that differ. The result says, per target
    digest, ``identical``, ``different`` or why it was not rebuilt."""
    store = runtime.installed_store()
    tc = runtime.current_toolchain()
    assert store is not None and tc is not None
    targets = set(task.targets or ())
    with tempfile.TemporaryDirectory(prefix="fa4cache-verify-") as tmp:
        scratch = Store(
            replace(
                store.settings,
                cache_dir=Path(tmp) / "store",
                base_dirs=(),
                remote_tier=None,
                distributed=False,
                max_size=None,
                node_local=False,
            )
        )
        with _storing_into(scratch):
            out = compile_task(replace(task, rebuild=False, ahead=False, wait=False))
        rebuilt = [e.ref for e in scratch.entries(toolchain=tc.id) if e.ref.digest in targets]
        rep = RebuildReport()
        _compare(store, scratch, rebuilt, rep)
    verified: dict[str, str] = {}
    for ref in rep.identical:
        verified[ref.digest] = "identical"
    for ref in rep.different:
        verified[ref.digest] = "different"
        store.quarantine(ref, MISMATCH)
        store.counters.add("verify_mismatches")
    for ref, why in rep.not_rebuilt:
        verified[ref.digest] = f"not rebuilt: {why}"
    errors = "; ".join(str(e) for e in (out.get("errors") or {}).values()) or out.get("error")
    for digest in targets - set(verified):
        why = f"the rebuild failed: {errors}" if errors else "the call did not ask for this kernel here"
        verified[digest] = f"not rebuilt: {why}"
    store.counters.add("verified_hits", len(rep.identical) + len(rep.different))
    store.counters.flush()
    return {**out, "compiled": {}, "verified": verified}


@contextmanager
def _storing_into(scratch: Store) -> Iterator[None]:
    """This process's compile caches publish into ``scratch`` (a forked child, one thread)."""
    from fa4cache.adapters.patch import installed_route

    route = installed_route()
    if route is None:
        raise RuntimeError("fa4cache is not installed in this compile worker")
    real = route.store
    route.store = scratch
    runtime.register(scratch, route.toolchain)
    try:
        yield
    finally:
        route.store = real
        runtime.register(real, route.toolchain)


def _main(argv: list[str]) -> int:
    """In the rebuild process: compile one spec into FA4CACHE_DIR."""
    from fa4cache.adapters.compile.target import target_scope
    from fa4cache.adapters.compile.warm_specs import compile_spec
    from fa4cache.adapters.patch import install

    from fa4cache.aot.plan import Target
    from fa4cache.aot.spec import KernelSpec

    spec = KernelSpec.from_dict(json.loads(argv[0]))
    install()
    # The spec's own target, set as warm sets it (FLASH_ATTENTION_ARCH alone, or nothing, on a
    # CPU host made every rebuild fail with FA4's "Only SM 9.x is supported").
    with target_scope(Target(spec.arch)):
        compile_spec(spec)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
