"""A rank of a ``torchrun`` job for tests/adapters/distributed/test_torchrun.py (gloo, CPU).

Ranks are grouped into "nodes" of ``--per-node`` ranks, each node with its own store
``<base>/node-<n>``. Scenarios (``--scenario``):

* ``cold``: every rank asks for the same ``--keys`` fake kernels at once (a compile takes
  ``--seconds``); then a rank with a fresh store (a node joining later) asks again; then a
  damaged copy in the job's store is refused and compiled locally.
* ``kill``: rank 0 starts a helper process (its own one-rank group on the job's store
  server) that takes a key's lease and is SIGKILLed mid-compile; rank 1 asks for the key.
* ``torn``: a helper hosts a store server of its own; a child joins a group on it, the
  helper dies, and the child's misses compile locally, one warning, no hang.
* ``real``: a real FA4 forward+backward (cross-compiled, FakeTensorMode), once per rank.
* ``split``: the ranks split ``--keys`` fake kernels (:mod:`fa4cache.adapters.compile.split`).
* ``attack``: an attacker writes the job's store between the ranks (:func:`attacked`).

``child`` mode (``python -m tests.helpers.dist_worker child HOST PORT KEY SECONDS``) is the helper.
Each rank prints ``RESULT <json>`` and writes it to ``<base>/result-<rank>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")

ROOT = Path(__file__).resolve().parents[2]


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING and record.name.startswith("fa4cache"):
            self.warnings.append(record.getMessage())


def _keep() -> Keep:
    k = Keep()
    logging.getLogger("fa4cache").addHandler(k)
    logging.getLogger("fa4cache").setLevel(logging.INFO)
    return k


def _store(d: Path) -> Any:
    from fa4cache.store.store import Store

    return Store.at(d, distributed=True)


def _counts(store: Any) -> dict[str, float]:
    v = store.counters.values
    return {k: v[k] for k in ("compiles", "remote_hits", "misses", "disk_hits")}


def child(
    host: str, port: int, key: int, seconds: float, cache_dir: str, serve: bool, freeze: bool = False
) -> None:
    """A process with a one-rank group of its own on ``host:port`` (``serve``: it hosts that
    store server itself in a grandchild, then kills it)."""
    import datetime

    import torch.distributed as dist

    from tests.helpers.fake_compiler import FakeFA4

    keep = _keep()
    server = None
    if serve:
        server = subprocess.Popen(
            [sys.executable, "-c", "import sys,time,datetime,torch.distributed as d;"
             "s=d.TCPStore('127.0.0.1',0,is_master=True,wait_for_workers=False);"
             "print(s.port,flush=True);time.sleep(600)"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        port = int(server.stdout.readline())  # type: ignore[union-attr]
    client = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"child{os.getpid()}", client), rank=0, world_size=1
    )
    fake = FakeFA4(_store(Path(cache_dir)), compile_seconds=seconds)
    if server is not None:
        fake.call(key, 0)  # with the store up: compiled and uploaded
        if freeze:  # a server that stops answering (a hung host, a partition), connections open
            os.kill(server.pid, signal.SIGSTOP)
        else:
            server.kill()
            server.wait()
        t0 = time.monotonic()
        for k in (key + 1, key + 2):
            fake.call(k, 0)
        out = {"compiles": fake.compiles, "seconds": time.monotonic() - t0, "warnings": keep.warnings}
        print("RESULT " + json.dumps(out), flush=True)
        if freeze:
            server.kill()
            server.wait()
        return
    print("LEASING", flush=True)
    fake.call(key, 0)  # killed mid-compile by the parent


def _run_child(key: int, seconds: float, cache_dir: Path, mode: str) -> dict[str, Any]:
    """:func:`child` in a process of its own, hosting its own store server (``mode``: "serve"
    kills that server mid-run, "freeze" stops it); its RESULT, or its stderr's tail."""
    c = subprocess.run(
        [sys.executable, "-m", "tests.helpers.dist_worker", "child", "127.0.0.1", "0", str(key), str(seconds),
         str(cache_dir), mode],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    line = [x for x in c.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[-1][7:]) if line else {"stderr": c.stderr[-2000:]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        a = sys.argv[2:]
        child(a[0], int(a[1]), int(a[2]), float(a[3]), a[4], a[5] in ("serve", "freeze"), a[5] == "freeze")
        return
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--per-node", type=int, default=1)
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--seconds", type=float, default=0.3)
    p.add_argument("--offset", type=int, default=0, help="first key (the test draws it from its seed)")
    p.add_argument("--attack", default="plant", help="attack scenario: plant, swap or forge")
    a = p.parse_args()
    import torch.distributed as dist

    from tests.helpers.fake_compiler import FakeFA4

    keep = _keep()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = rank // a.per_node
    base = Path(a.base)
    store = _store(base / f"node-{node}")
    out: dict[str, Any] = {"rank": rank, "node": node}
    if a.scenario == "cold":
        fake = FakeFA4(store, compile_seconds=a.seconds)
        dist.barrier()
        keys = range(a.offset, a.offset + a.keys)
        for k in keys:
            assert fake.call(k, 1) == k + 1
        out["cold"] = {"compiles": fake.compiles, **_counts(store)}
        dist.barrier()
        if rank == world - 1 and store.remote.active():  # a node that joins later, with an empty store
            late = FakeFA4(_store(base / "late"), compile_seconds=a.seconds)
            for k in keys:
                assert late.call(k, 1) == k + 1
            out["late"] = {"compiles": late.compiles, **_counts(late.cache._inst.store)}
            again = FakeFA4(_store(base / "node-0"), compile_seconds=a.seconds)  # a restart, same store
            for k in keys:
                assert again.call(k, 1) == k + 1
            out["restart"] = {"compiles": again.compiles, **_counts(again.cache._inst.store)}
            # Damage the job's copy of key 0 (same length): a fresh node must not load it.
            from fa4cache.adapters.distributed.tier import chunk_key

            tier = late.cache._inst.store.remote
            st = tier._connect()
            ref = late.cache.ref(a.offset)
            sha = late.cache._inst.store.read_sidecar(ref).sha256  # the copy late fetched
            good = st.get(chunk_key(ref.digest, sha, 0))
            st.set(chunk_key(ref.digest, sha, 0), bytes([good[0] ^ 1]) + good[1:])
            bad = FakeFA4(_store(base / "bad"), compile_seconds=0)
            assert bad.call(a.offset, 1) == a.offset + 1 and bad.call(a.offset + 1, 1) == a.offset + 2
            out["corrupt"] = {"compiles": bad.compiles, **_counts(bad.cache._inst.store)}
        out["tier"] = {"uploaded": store.remote.uploaded, "fetched": store.remote.fetched}
    elif a.scenario == "kill":
        from torch.distributed.distributed_c10d import _get_default_store

        under = _get_default_store()
        while hasattr(under, "underlying_store"):
            under = under.underlying_store
        fake = FakeFA4(store, compile_seconds=a.seconds)
        if rank == 0:
            c = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.dist_worker", "child", under.host, str(under.port), "7", "60",
                 str(base / "node-0"), "lease"],
                stdout=subprocess.PIPE, text=True, cwd=ROOT,
            )  # fmt: skip
            assert c.stdout is not None and c.stdout.readline().strip() == "LEASING"
            time.sleep(1.0)  # it holds the lease now, compiling for 60 s
            dist.barrier()
            time.sleep(0.5)  # rank 1 is waiting on the lease
            os.kill(c.pid, signal.SIGKILL)
            c.wait()
            dist.barrier()
        else:
            dist.barrier()
            t0 = time.monotonic()
            fake.call(7, 0)
            out["waited"] = time.monotonic() - t0
            out["handovers"] = store.remote.handovers
            dist.barrier()
        out["kill"] = {"compiles": fake.compiles}
    elif a.scenario == "torn":
        from torch.distributed.distributed_c10d import _get_default_store

        if rank == 0:
            out["torn"] = _run_child(20, a.seconds, base / "torn", "serve")
            t0 = time.monotonic()
            out["frozen"] = _run_child(40, a.seconds, base / "frozen", "freeze")
            out["frozen"]["exit_seconds"] = time.monotonic() - t0
        dist.barrier()
        # Destroyed group: the tier is off again, misses compile locally.
        fake = FakeFA4(store, compile_seconds=0)
        dist.destroy_process_group()
        fake.call(30 + rank, 0)
        out["destroyed"] = {"compiles": fake.compiles, "remote": store.remote.active()}
    elif a.scenario == "real":
        out["real"] = real_step(store)
    elif a.scenario == "attack":
        out["attack"] = attacked(store, base, rank, a.offset, a.attack)
    elif a.scenario == "split":
        out["split"] = split_fake(store, range(a.offset, a.offset + a.keys), a.seconds)
    out["warnings"] = keep.warnings
    print("RESULT " + json.dumps(out), flush=True)  # stdouts of ranks interleave: a file too
    (base / f"result-{rank}.json").write_text(json.dumps(out))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def attacked(store: Any, base: Path, rank: int, key: int, attack: str) -> dict[str, Any]:
    """Two ranks, an attacker in between (tests/adapters/distributed/test_outsiders.py; ``lease``: it
    holds the key's lease instead of writing a copy): rank 0 first
    compiles what the attack needs (``swap``: the key itself; ``forge``: another key, whose
    signed manifest the attacker copies), then says where the job's store is in
    ``<base>/pub/job.json`` (what an attacker learns from ``/proc/net/tcp``, the public key
    encoding and ``TCPStore.list_keys``) and waits for ``<base>/pub/go``; then rank 0 and
    after it rank 1 ask for the key. A fake kernel returns ``x + key``: the attacker's
    returns ``x + 1000000``."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    from fa4cache.hashing import encode_key
    from tests.helpers.fake_compiler import FakeFA4

    fake = FakeFA4(store, compile_seconds=0)
    pub = base / "pub"
    if rank == 0:
        for k in {"plant": [], "lease": [], "swap": [key], "forge": [key + 1]}[attack]:
            assert fake.call(k, 0) == k
        under = _get_default_store()
        while hasattr(under, "underlying_store"):
            under = under.underlying_store
        tier = store.remote
        assert tier.active()
        info = {
            "host": "127.0.0.1", "port": under.port, "prefix": getattr(tier, "prefix", "") or "fa4cache/v1",
            "tc": fake.cache.ref(key).toolchain, "kind": fake.cache.ref(key).kind,
            "digest": fake.cache.ref(key).digest, "key_text": encode_key(key),
            "other_digest": fake.cache.ref(key + 1).digest,
        }  # fmt: skip
        (pub / "job.json").write_text(json.dumps(info))
        (pub / "job.json").chmod(0o644)
    deadline = time.monotonic() + 120
    while not (pub / "go").exists():
        assert time.monotonic() < deadline, "the test never said go"
        time.sleep(0.1)
    got: dict[str, Any] = {}
    for turn in (0, 1):
        dist.barrier()
        if turn == rank:
            before, t0 = fake.compiles, time.monotonic()
            got = {"value": fake.call(key, 0), "compiles": fake.compiles - before}
            got["seconds"] = time.monotonic() - t0
    got["remote_hits"] = _counts(store)["remote_hits"]
    return got


def split_fake(store: Any, keys: range, seconds: float) -> dict[str, Any]:
    """:func:`compile_across` over ``keys`` fake kernels of ``seconds`` each."""
    import dataclasses

    import torch.distributed as dist
    from fa4cache.adapters.compile.split import compile_across

    from tests.helpers.fake_compiler import FakeCompiled, FakeFA4

    fake = FakeFA4(store, compile_seconds=seconds)
    cache = fake.cache

    def compile_one(key: int, held: Any) -> str:
        if cache._miss(key, held=held):
            return "present"
        time.sleep(seconds)
        fake.compiles += 1
        cache[key] = FakeCompiled(key)
        return "compiled"

    dist.barrier()
    res = compile_across(
        store,
        list(keys),
        digest=lambda k: cache.ref(k).digest,
        present=lambda k: store.layout.sidecar_path(cache.ref(k)).exists(),
        compile_one=compile_one,
    )
    out = dataclasses.asdict(res)
    out.pop("digests")
    return {**out, "compiles": fake.compiles, **_counts(store)}


def real_step(store: Any) -> dict[str, Any]:
    """One FA4 varlen forward+backward with a document mask, cross-compiled (fake tensors)."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from fa4cache.adapters.compile.warm_specs import fake_varlen_call
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fa4cache
    from fa4cache.masks import make_document_mask

    st = fa4cache.install(store.root, distributed=True, compile_server=False)
    import flash_attn.cute.interface  # noqa: F401

    T, H = 256, 2
    cu = torch.tensor([0, T // 3, T])
    ids = torch.repeat_interleave(torch.arange(2), cu[1:] - cu[:-1]).view(1, T)
    mask = make_document_mask(document_ids=ids)
    dist.barrier()
    t0 = time.monotonic()
    with FakeTensorMode():
        q, k, v = (torch.empty(1, T, H, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        fake_varlen_call(mask, q, k, v, backward=True)
    seconds = time.monotonic() - t0
    dist.barrier()  # both ranks' steps done: every fetch from the other has happened
    st.counters.flush()  # folds in what the other rank fetched from this one's uploads
    return {"seconds": seconds, "fetch_seconds": st.counters.counts()["remote_seconds"],
            "served": st.counters.counts()["served"], **_counts(st)}  # fmt: skip


if __name__ == "__main__":
    main()
