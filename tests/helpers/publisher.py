"""Hammers a store with publishes, sidecar touches, counter flushes and removals, forever.

The fault tests SIGKILL it at random moments. It uses the real Store; artifact bytes
come from a real compiled kernel (path in argv[1]).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from fa4cache.store.maintenance import remove
from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Store

data = Path(sys.argv[1]).read_bytes()
seed = int(sys.argv[2])
rng = random.Random(seed)
store = Store()
TC = "ab" * 10
digests = [f"{i:064x}" for i in range(1, 9)]
print("READY", flush=True)
n = 0
while True:
    ref = EntryRef(TC, rng.choice(["fwd", "bwd"]), rng.choice(digests))
    op = rng.random()
    if op < 0.6:
        lk = store.locks.acquire(ref.digest)
        try:
            staged = store.staging_path(ref)
            assert staged is not None
            with open(staged, "wb") as f:
                f.write(data)
            store.publish(ref, staged, compile_seconds=1.0, summary={"n": n})
        finally:
            if lk is not None:
                lk.release()
        store.counters.add("compiles", kind=ref.kind)
        store.counters.add("compile_seconds", 1.0, kind=ref.kind)
        store.counters.flush()
    elif op < 0.85:
        art = store.load(ref)
        if art is not None:
            assert art.data == data, "served a torn artifact"
            store.counters.add("disk_hits", kind=ref.kind)
            store.touch(art)
            store.flush_touches()
            store.counters.flush()
    elif op < 0.95:
        remove(store, ref)
        store.counters.add("evictions")
        store.counters.flush()
    else:
        store.quarantine(ref, "test")
    n += 1
