"""The run-time patch check (``fa4cache.patched_code``) at a process's first kernel key, with FA4,
the DSL and QuACK imported and fa4cache installed; nothing patched.

Three ways to answer the same question, alternating, median of the rounds:

* ``full walk``: every function judged and the snapshot taken (what the import-time warm-up
  thread pays);
* ``per record``: every module's and class's record compared with what it holds now, one
  at a time (the check as it stood before the snapshot);
* ``snapshot, contents compared``: the last whole walk's records compared in a few passes over
  all of them at once (what a process's first key pays where dict version tags are not used);
* ``snapshot, version tags read``: the same, but a namespace whose version tag did not move is
  not read (:mod:`fa4cache.dict_versions`; what a first key pays on CPython 3.11-3.13).

    python benchmarks/bench_patch_check.py [--rounds 15]   (CPU: cross-compile target set here)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

from common import save, table


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    for var, value in (("FLASH_ATTENTION_ARCH", "sm_90"), ("CUTE_DSL_ARCH", "sm_90a")):
        os.environ.setdefault(var, value)
    import fa4cache

    fa4cache.install()
    import flash_attn.cute.interface  # noqa: F401
    import torch

    from fa4cache import patched_code as pc

    assert pc.runtime_patches(snapshot=True) == [], (
        "something is patched: the check's fast path would not run"
    )

    def full_walk() -> None:  # the warm-up: every function judged, the snapshot taken
        pc._walked, pc._snapshot = {}, None
        pc.runtime_patches(snapshot=True)

    def per_record() -> None:
        pc._snapshot = None
        pc.runtime_patches()

    tagged = pc._snapshot
    assert tagged is not None

    def by_contents() -> None:  # the snapshot's passes over what every namespace holds
        pc._snapshot = dataclasses.replace(tagged, tags=None)
        pc.runtime_patches()
        pc._snapshot = tagged

    def by_tags() -> None:  # the same, where a namespace's version tag says it did not change
        pc.runtime_patches()

    ways = {
        "full walk": full_walk,
        "per record": per_record,
        "snapshot, contents compared": by_contents,
        "snapshot, version tags read": by_tags,
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(a.rounds):
        for name in list(ways) if r % 2 == 0 else list(reversed(ways)):
            t = time.perf_counter()
            ways[name]()
            times[name].append(time.perf_counter() - t)
            if name in ("per record", "full walk"):
                pc.runtime_patches(snapshot=True)  # (untimed) the snapshot back for the next way
                tagged = pc._snapshot
    med = {k: statistics.median(v) for k, v in times.items()}
    s = pc._snapshot
    assert s is not None
    rows = [[k, med[k] * 1e3, med[k] / med["full walk"], med[k] / med["per record"]] for k in ways]
    where = (
        "cpu"
        if not torch.cuda.is_available()
        else "h200"
        if "H200" in torch.cuda.get_device_name()
        else "h100"
    )
    body = table(["way", "median ms", "vs full walk", "vs per record"], rows)
    size = (
        f"{len(s.containers)} modules and classes, {len(s.names)} names, {len(s.fns)} functions; "
        f"{a.rounds} rounds, alternating"
    )
    save(
        f"patch_check_{where}",
        "The run-time patch check at a process's first key (nothing patched)",
        [(size, body)],
        {"median_s": med, "rounds_s": times, "containers": len(s.containers), "functions": len(s.fns)},
    )


if __name__ == "__main__":
    main()
