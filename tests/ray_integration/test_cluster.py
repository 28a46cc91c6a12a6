"""Compile once per Ray cluster. A real multi-node Ray cluster on 127.0.0.1, each node
with its own node-local store (``{node_id}``); the fake compiler where a real FA4 compile is
not the point, and one real cross-compiled FA4 kernel fetched and loaded on another node."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from fa4cache.store.paths import LAYOUT, EntryRef

# One Ray cluster at a time on this machine, in a parallel run too.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

ROOT = Path(__file__).resolve().parents[2]
CROSS = {"FLASH_ATTENTION_ARCH": "sm_90", "CUTE_DSL_ARCH": "sm_90a", "FLASH_ATTENTION_NUM_SMS": "132"}
KINDS = ("fwd", "bwd_preprocess", "bwd", "bwd_postprocess_convert")  # a fwd+bwd kernel set

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="module")
def cluster() -> Any:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def _connect(cluster: Any, tmp_path: Path, **extra_env: str) -> Any:
    import ray

    import fa4cache

    env = fa4cache.env(
        str(tmp_path / "node-{node_id}"),
        cluster=True,
        # A loaded 2-core CI machine can hold one Ray call past the default 10 s, and a node
        # that cannot reach the registry compiles alone (correct, but not what these tests count).
        runtime_env={
            "env_vars": {"PYTHONPATH": str(ROOT), **CROSS, "FA4CACHE_CLUSTER_TIMEOUT": "60", **extra_env}
        },
    )
    ray.shutdown()
    ray.init(address=cluster.address, runtime_env=env, log_to_driver=False)
    from fa4cache.ray_integration.cluster import shutdown

    shutdown()  # a registry and servers left by an earlier test's stores
    return ray


def _nodes(ray: Any) -> list[str]:
    return sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])


class NodeWorker:
    """One process on one node, running FA4-shaped fake entry points against its store."""

    def __init__(self, compile_seconds: float = 0.0) -> None:
        import logging

        from fa4cache.store.store import Store

        self.store = Store()  # FA4CACHE_DIR with {node_id}, FA4CACHE_REMOTE_TIER: from the job env
        self.compile_seconds = compile_seconds
        self.fakes: dict[str, Any] = {}
        self.warnings: list[str] = []
        worker = self

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.levelno >= logging.WARNING:
                    worker.warnings.append(record.getMessage())

        logging.getLogger("fa4cache").addHandler(Keep())

    def run(self, keys: list[int], kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
        import ray

        from tests.helpers.fake_compiler import FakeFA4

        before = dict(self.store.counters.values)
        t0 = time.perf_counter()
        compiles, values = 0, []
        for kind in kinds:
            fa = self.fakes.setdefault(kind, FakeFA4(self.store, kind, self.compile_seconds))
            c0 = fa.compiles
            values += [fa.call(k, 1) for k in keys]
            compiles += fa.compiles - c0
        self.store.counters.flush()
        after = self.store.counters.values
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "root": str(self.store.root),
            "compiles": compiles,
            "values": values,
            "seconds": time.perf_counter() - t0,
            "warnings": list(self.warnings),
            **{f: after[f] - before[f] for f in ("remote_hits", "remote_seconds", "disk_hits", "misses")},
        }

    def ready(self) -> str:
        import ray

        assert self.store.remote._connect() is not None  # joined the cluster tier before any run
        return ray.get_runtime_context().get_node_id()


def _workers(ray: Any, nodes: list[str], compile_seconds: float = 0.0) -> list[Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cls = ray.remote(num_cpus=0)(NodeWorker)
    ws = [
        cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(compile_seconds)
        for n in nodes
    ]
    assert ray.get([w.ready.remote() for w in ws], timeout=120) == nodes  # every process up: start together
    return ws


def _expected(keys: list[int], kinds: tuple[str, ...] = KINDS) -> list[int]:
    return [k + 1 for _ in kinds for k in keys]


def test_three_cold_nodes_compile_each_kernel_once_and_a_later_node_none(
    cluster: Any, tmp_path: Path
) -> None:
    from fa4cache.ray_integration.cluster import registry_info

    from fa4cache.store.stats import collect

    ray = _connect(cluster, tmp_path)
    nodes = _nodes(ray)
    assert len(nodes) == 3
    ws = _workers(ray, nodes, compile_seconds=1.0)
    out = ray.get([w.run.remote([3]) for w in ws], timeout=180)
    assert all(o["values"] == _expected([3]) for o in out), out
    assert sum(o["compiles"] for o in out) == len(KINDS), out  # once per kernel, cluster-wide
    assert sum(o["remote_hits"] for o in out) == 2 * len(KINDS), out
    assert all(o["warnings"] == [] for o in out), out
    assert len({o["root"] for o in out}) == 3  # node-local stores, nothing shared on disk

    # A node that joins later (autoscaling, a replaced node) compiles nothing.
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    new = sorted(set(_nodes(ray)) - set(nodes))
    assert len(new) == 1
    # Two processes on it: the one holding a key's node lock fetches, the other loads that copy.
    pair = ray.get([w.run.remote([3]) for w in _workers(ray, new * 2)], timeout=120)
    assert all(p["compiles"] == 0 and p["values"] == _expected([3]) for p in pair), pair
    assert sum(p["remote_hits"] for p in pair) == len(KINDS), pair  # one fetch per node
    assert sum(p["disk_hits"] for p in pair) == 2 * len(KINDS), pair
    late = pair[0]

    info = registry_info()
    assert info is not None and info["digests"] == len(KINDS) and info["copies"] == 4 * len(KINDS), info
    assert info["granted"] == len(KINDS) and info["handovers"] == 0, info  # one lease per kernel
    # Per-node stats: what each node fetched, and what its server sent to the others.
    stats = [collect(o["root"]) for o in [*out, late]]
    assert sum(s["remote_hits"] for s in stats) == 3 * len(KINDS)
    assert sum(s["served"] for s in stats) == 3 * len(KINDS), [s["served"] for s in stats]
    assert sum(s["compiles"] for s in stats) == len(KINDS)
    assert all(s["entries"] == len(KINDS) for s in stats)


def test_a_corrupt_copy_is_never_loaded_on_another_node(cluster: Any, tmp_path: Path) -> None:
    from fa4cache.hashing import encode_key, key_digest
    from tests.helpers.fake_compiler import TOOLCHAIN

    ray = _connect(cluster, tmp_path)
    a_node, b_node = _nodes(ray)[:2]
    a, b = _workers(ray, [a_node, b_node])
    first = ray.get(a.run.remote([11], ("fwd",)), timeout=120)
    assert first["compiles"] == 1
    ref = EntryRef(TOOLCHAIN.id, "fwd", key_digest(TOOLCHAIN.id, "fwd", encode_key(11)))
    obj = Path(first["root"]) / LAYOUT / ref.toolchain / ref.kind / f"{ref.digest}.o"
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    obj.write_bytes(bytes(data))

    got = ray.get(b.run.remote([11], ("fwd",)), timeout=120)
    # A's server found its copy corrupt (and quarantined it) instead of sending it: B compiled.
    assert got["remote_hits"] == 0 and got["compiles"] == 1 and got["values"] == [12], got
    assert list((Path(first["root"]) / "quarantine").glob(f"{ref.digest}.*.o"))
    # A, with no copy left, now fetches B's good one.
    again = ray.get(_workers(ray, [a_node])[0].run.remote([11], ("fwd",)), timeout=120)
    assert again["compiles"] == 0 and again["remote_hits"] == 1 and again["values"] == [12], again


def test_bytes_that_do_not_match_their_sidecar_are_refused() -> None:
    import random

    from fa4cache.ray_integration.cluster import verified

    from fa4cache.store.sidecar import Sidecar

    seed = int(os.environ.get("FA4CACHE_FUZZ_SEED", "0"))
    rng = random.Random(seed)
    print("seed", seed)
    from fa4cache.hashing import key_digest

    ref = EntryRef("fa4e000000000000cafe", "fwd", key_digest("fa4e000000000000cafe", "fwd", '"k"'))
    data = rng.randbytes(rng.randint(1, 4096))
    side = Sidecar.for_data(ref, data, created=1.0, key='"k"').to_bytes()
    assert verified(ref, (side, data)) is not None
    # Key text that does not hash to the digest asked for (or none at all): refused.
    for key in ('"other"', None):
        assert verified(ref, (Sidecar.for_data(ref, data, created=1.0, key=key).to_bytes(), data)) is None
    for _ in range(50):
        bad = bytearray(data)
        bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        assert verified(ref, (side, bytes(bad))) is None
    assert verified(ref, (side, data[:-1])) is None
    assert (
        verified(EntryRef(ref.toolchain, "bwd", ref.digest), (side, data)) is None
    )  # another entry's sidecar
    assert verified(ref, (side + b" " * (300 * 1024), data)) is None
    assert (
        verified(ref, None) is None and verified(ref, (side,)) is None and verified(ref, ("x", data)) is None
    )


class RogueServer:
    """A node server that answers every fetch with bytes filed under another key: that key's
    artifact and sidecar, the sidecar's digest field made to agree with the digest asked for."""

    def __init__(self, sidecar: dict[str, Any], data: bytes) -> None:
        self.sidecar, self.data = sidecar, data

    def fetch(self, toolchain: str, kind: str, digest: str) -> tuple[bytes, bytes]:
        import json

        return json.dumps(dict(self.sidecar, digest=digest)).encode(), self.data


@pytest.mark.parametrize("key", ["other-keys-text", "bogus-text", "no-key-text"])
def test_a_node_that_files_bytes_under_another_key_is_not_taken(
    cluster: Any, tmp_path: Path, key: str
) -> None:
    """The review's node that served the mask=none kernel as the causal
    one had it taken by 2 of 2 nodes. Its checksum is right; its key text is not the key's."""
    import json

    from fa4cache.ray_integration.cluster import NAMESPACE, registry_name, server_prefix
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from fa4cache.hashing import encode_key, key_digest
    from fa4cache.store.paths import Layout
    from tests.helpers.fake_compiler import TOOLCHAIN

    ray = _connect(cluster, tmp_path)
    a_node, b_node, c_node = _nodes(ray)[:3]
    (a,) = _workers(ray, [a_node])
    first = ray.get(a.run.remote([32], ("fwd",)), timeout=120)
    assert first["compiles"] == 1
    ref32, ref33 = (
        EntryRef(TOOLCHAIN.id, "fwd", key_digest(TOOLCHAIN.id, "fwd", encode_key(k))) for k in (32, 33)
    )
    lay = Layout(Path(first["root"]))
    side = json.loads(lay.sidecar_path(ref32).read_bytes())
    side["key"] = {"other-keys-text": side["key"], "bogus-text": "33", "no-key-text": None}[key]
    job = ray.get_runtime_context().get_job_id()
    name = f"{server_prefix(job)}rogue-{key}"  # an actor of this job's: inside the trust boundary
    rogue = (
        ray.remote(num_cpus=0)(RogueServer)
        .options(
            name=name, namespace=NAMESPACE, scheduling_strategy=NodeAffinitySchedulingStrategy(a_node, False)
        )
        .remote(side, lay.object_path(ref32).read_bytes())
    )
    ray.get(rogue.fetch.remote(ref33.toolchain, ref33.kind, ref33.digest), timeout=60)
    reg = ray.get_actor(registry_name(job), namespace=NAMESPACE)
    ray.get(reg.announce.remote(ref33.digest, name, a_node), timeout=30)

    b, c = _workers(ray, [b_node, c_node])
    got = ray.get(b.run.remote([33], ("fwd",)), timeout=120)
    assert got["values"] == [34] and got["compiles"] == 1 and got["remote_hits"] == 0, got  # never 33 + 32
    assert any("do not match their key or checksum" in w for w in got["warnings"]), got["warnings"]
    # The rogue was forgotten; a third node fetches the good copy B compiled.
    late = ray.get(c.run.remote([33], ("fwd",)), timeout=120)
    assert late["values"] == [34] and late["compiles"] == 0 and late["remote_hits"] == 1, late
    # Its copy says who compiled it (B's process) and where it came from (B's node).
    side_c = json.loads(
        (Path(late["root"]) / LAYOUT / ref33.toolchain / "fwd" / f"{ref33.digest}.json").read_text()
    )
    assert side_c["received"].startswith(f"cluster node {b_node[:12]}") and side_c["origin"]["pid"] > 0, (
        side_c
    )
    ray.kill(rogue, no_restart=True)


OTHER_JOB = """
import json, sys, time
import ray
import fa4cache
from tests.ray_integration.test_cluster import CROSS, ROOT, NodeWorker, RogueServer
addr, root, mode = sys.argv[1], sys.argv[2], sys.argv[3]
env = fa4cache.env(root + "/node-{node_id}", cluster=True, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **CROSS}})
ray.init(address=addr, runtime_env=env, log_to_driver=False)
job = ray.get_runtime_context().get_job_id()
if mode == "work":
    w = ray.remote(num_cpus=0)(NodeWorker).remote()
    out = ray.get(w.run.remote([61], ("fwd",)), timeout=120)
    print(json.dumps({"job": job, "compiles": out["compiles"]}), flush=True)
else:  # rogue: VICTIM_JOB SIDECAR_JSON DATA_HEX DIGEST NODE
    from fa4cache.ray_integration.cluster import NAMESPACE, registry_name, server_prefix
    victim, side, data, digest, node = sys.argv[4:9]
    name = server_prefix(victim) + "rogue"  # squats the victim job's names
    rogue = ray.remote(num_cpus=0)(RogueServer).options(name=name, namespace=NAMESPACE, lifetime="detached").remote(
        json.loads(side), bytes.fromhex(data))
    ray.get(rogue.fetch.remote("t", "k", digest), timeout=60)
    reg = ray.get_actor(registry_name(victim), namespace=NAMESPACE)
    ray.get(reg.announce.remote(digest, name, node), timeout=30)
    print(json.dumps({"job": job, "rogue": name}), flush=True)
time.sleep(3600)  # until the test kills this driver (SIGKILL)
"""


def _other_job(cluster: Any, tmp_path: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    """Another job's driver (a process of its own), started and left running; its first line."""
    import json
    import subprocess
    import sys

    p = subprocess.Popen(
        [sys.executable, "-c", OTHER_JOB, cluster.address, str(tmp_path / "other"), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        p.kill()
        raise AssertionError(p.communicate(timeout=30)[1][-3000:])
    return p, json.loads(line)


def _fa4cache_actors_of(ray: Any, job: str) -> list[str]:
    from fa4cache.ray_integration.cluster import NAMESPACE, actor_job

    out = []
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a.get("namespace") != NAMESPACE:
            continue
        try:
            h = ray.get_actor(a["name"], namespace=NAMESPACE)
        except ValueError:
            continue  # gone meanwhile
        if actor_job(h) == job:
            out.append(a["name"])
    return out


def test_a_jobs_registry_and_servers_end_with_it_even_after_sigkill(cluster: Any, tmp_path: Path) -> None:
    """The registry and node servers were detached and cluster-wide, so one
    job's (or a poisoned store's) leftovers served every later job. Now they are named for
    their job, and end with it: here the driver is killed with SIGKILL."""
    ray = _connect(cluster, tmp_path)
    p, first = _other_job(cluster, tmp_path, "work")
    assert first["compiles"] == 1, first
    job = first["job"]
    assert len(_fa4cache_actors_of(ray, job)) >= 2  # its registry and a node server
    p.kill()
    p.wait(timeout=30)
    t0 = time.monotonic()
    while (left := _fa4cache_actors_of(ray, job)) and time.monotonic() - t0 < 90:
        time.sleep(1)
    print(f"the killed job's actors were gone {time.monotonic() - t0:.1f} s after SIGKILL")
    assert left == [], left


def test_another_jobs_actor_is_never_a_holder(cluster: Any, tmp_path: Path) -> None:
    """Finding 2: an actor of another job, named like this job's servers and announced to this
    job's registry, serving bytes under the correct key text (what the key check cannot catch):
    never fetched from."""
    import json

    from fa4cache.hashing import encode_key, key_digest
    from fa4cache.store.paths import Layout
    from tests.helpers.fake_compiler import TOOLCHAIN

    ray = _connect(cluster, tmp_path)
    a_node, b_node = _nodes(ray)[:2]
    (a,) = _workers(ray, [a_node])
    first = ray.get(a.run.remote([62], ("fwd",)), timeout=120)
    ref62, ref63 = (
        EntryRef(TOOLCHAIN.id, "fwd", key_digest(TOOLCHAIN.id, "fwd", encode_key(k))) for k in (62, 63)
    )
    lay = Layout(Path(first["root"]))
    side = json.loads(lay.sidecar_path(ref62).read_bytes())
    side["key"] = encode_key(63)  # right key text, another kernel's bytes
    data = lay.object_path(ref62).read_bytes()
    victim = ray.get_runtime_context().get_job_id()
    p, info = _other_job(
        cluster, tmp_path, "rogue", victim, json.dumps(side), data.hex(), ref63.digest, a_node
    )
    try:
        (b,) = _workers(ray, [b_node])
        got = ray.get(b.run.remote([63], ("fwd",)), timeout=120)
        assert got["values"] == [64] and got["compiles"] == 1 and got["remote_hits"] == 0, (
            got
        )  # never 63 + 62
    finally:
        p.kill()
        from fa4cache.ray_integration.cluster import NAMESPACE

        ray.kill(ray.get_actor(info["rogue"], namespace=NAMESPACE), no_restart=True)


def _compile_real_fwd() -> dict[str, Any]:
    from fa4cache.adapters.compile.warm_specs import compile_spec

    from fa4cache.aot.spec import KernelSpec
    from fa4cache.store.runtime import installed_store

    s = installed_store()
    assert s is not None and type(s.remote).__name__ == "ClusterTier"
    before = dict(s.counters.values)
    t0 = time.perf_counter()
    compile_spec(KernelSpec(mask="document", backward=False, seqlen=640))
    return {
        "seconds": time.perf_counter() - t0,
        **{
            k: s.counters.values[k] - before[k]
            for k in ("compiles", "disk_hits", "remote_hits", "load_errors")
        },
    }


@pytest.mark.compile
def test_a_real_fa4_kernel_compiled_on_one_node_loads_on_another(cluster: Any, tmp_path: Path) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray = _connect(cluster, tmp_path)
    a_node, b_node = _nodes(ray)[:2]
    task = ray.remote(num_cpus=0, max_retries=0)(_compile_real_fwd)

    def on(node: str) -> dict[str, Any]:
        strat = NodeAffinitySchedulingStrategy(node, soft=False)
        return ray.get(task.options(scheduling_strategy=strat).remote(), timeout=300)

    first = on(a_node)
    assert first["compiles"] == 1 and first["remote_hits"] == 0, first
    second = on(b_node)
    # Fetched through Ray, verified, published in B's own store, loaded by cute: no compile.
    assert second == {**second, "compiles": 0, "disk_hits": 1, "remote_hits": 1, "load_errors": 0}, second


@pytest.mark.compile
def test_prewarm_split_claims_each_kernel_once_across_the_nodes(cluster: Any, tmp_path: Path) -> None:
    """prewarm(split=True): the warm runner on every node claims its share through the
    cluster tier and takes the rest from the others; every node ends with the whole set."""
    from fa4cache.ray_integration import prewarm

    from fa4cache.aot.spec import KernelSpec

    ray = _connect(cluster, tmp_path)
    specs = [KernelSpec(mask=m, head_dim=64, backward=False, seqlen=256) for m in ("causal", "document")]
    report = prewarm(specs, split=True, num_cpus=0)
    nodes = _nodes(ray)
    assert set(report) == set(nodes), report
    for r in report.values():
        assert r.failed == () and r.compiled + r.present == len(specs), r
    # Each kernel once in the cluster, each compile a node's claimed share (none left over).
    assert sum(r.compiled for r in report.values()) == len(specs), report
    assert sum(r.claimed for r in report.values()) == len(specs), report
    for node in nodes:
        entries = list((tmp_path / f"node-{node}").glob(f"{LAYOUT}/*/fwd/*.json"))
        assert len(entries) == len(specs), (node, entries)


def test_registry_killed_mid_run_means_local_compiles_and_no_failure(cluster: Any, tmp_path: Path) -> None:
    from fa4cache.ray_integration.cluster import NAMESPACE, registry_info, registry_name

    ray = _connect(cluster, tmp_path)
    nodes = _nodes(ray)[:3]
    ws = _workers(ray, nodes, compile_seconds=4.0)
    t0 = time.monotonic()
    pending = [w.run.remote([21], ("fwd",)) for w in ws]
    while (info := registry_info()) is None or info["leases"] == 0:  # one compiles, the others wait
        assert time.monotonic() - t0 < 60
        time.sleep(0.1)
    reg = registry_name(ray.get_runtime_context().get_job_id())
    ray.kill(ray.get_actor(reg, namespace=NAMESPACE), no_restart=True)
    out = ray.get(pending, timeout=120)
    assert all(o["values"] == [22] for o in out), out
    assert 1 <= sum(o["compiles"] for o in out) <= len(ws), out
    # Later kernels compile locally at once: no waiting on a registry that is gone.
    later = ray.get([w.run.remote([22], ("fwd",)) for w in ws], timeout=120)
    assert all(o["compiles"] == 1 and o["values"] == [23] and o["seconds"] < 15 for o in later), later
    for o in later:
        assert sum("registry unreachable" in w for w in o["warnings"]) == 1, o["warnings"]  # once


def test_a_bundle_in_the_runtime_env_fills_every_node(cluster: Any, tmp_path: Path) -> None:
    from fa4cache.store.bundle import export_bundle
    from tests.store.test_bundle import _fill

    assert _fill(tmp_path / "made", [41, 42]) == 2 * len(KINDS)
    bundle = tmp_path / "kernels.fa4b"
    export_bundle(tmp_path / "made", bundle)
    ray = _connect(cluster, tmp_path, FA4CACHE_BUNDLE=str(bundle))
    out = ray.get([w.run.remote([41, 42]) for w in _workers(ray, _nodes(ray)[:2])], timeout=120)
    for o in out:  # imported by the worker setup hook: loaded from the node's own store
        assert o["compiles"] == 0 and o["remote_hits"] == 0 and o["disk_hits"] == 2 * len(KINDS), o


@pytest.mark.parametrize("case", ["nested", "infinity"])
def test_a_malformed_bundle_in_the_runtime_env_is_a_warning(cluster: Any, tmp_path: Path, case: str) -> None:
    """With FA4CACHE_BUNDLE naming such a file every Ray worker died
    (RecursionError / OverflowError escaped the hook); now the worker lives, warns, compiles."""
    from tests.store.test_bytes_bound_to_keys import _malformed

    bundle = _malformed(tmp_path)[case]
    ray = _connect(cluster, tmp_path, FA4CACHE_BUNDLE=str(bundle))
    (o,) = ray.get([w.run.remote([51], ("fwd",)) for w in _workers(ray, _nodes(ray)[:1])], timeout=120)
    assert o["compiles"] == 1 and o["values"] == [52], o


def test_node_killed_mid_compile_costs_at_most_one_extra_compile(cluster: Any, tmp_path: Path) -> None:
    from fa4cache.ray_integration.cluster import registry_info

    # A short lease, so that the handover does not wait for Ray to declare the node dead.
    ray = _connect(cluster, tmp_path, FA4CACHE_CLUSTER_LEASE="6")
    while len(_nodes(ray)) < 4:  # the victim, two survivors and the head (run alone: one more)
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    head = cluster.head_node.node_id
    victim_node = next(n for n in cluster.list_all_nodes() if n.node_id != head)
    others = [n for n in _nodes(ray) if n not in (head, victim_node.node_id)][:2]
    victim = _workers(ray, [victim_node.node_id], compile_seconds=120.0)[0]
    survivors = _workers(ray, others, compile_seconds=1.0)
    t0 = time.monotonic()
    doomed = victim.run.remote([31], ("fwd",))
    while (info := registry_info()) is None or info["leases"] == 0:  # the victim holds the lease
        assert time.monotonic() - t0 < 60
        time.sleep(0.1)
    pending = [w.run.remote([31], ("fwd",)) for w in survivors]
    time.sleep(1.0)
    cluster.remove_node(victim_node, allow_graceful=False)
    out = ray.get(pending, timeout=120)
    assert time.monotonic() - t0 < 90  # nothing hung
    assert all(o["values"] == [32] for o in out), out
    # The victim's compile never finished; exactly one survivor compiled, the other fetched.
    assert sum(o["compiles"] for o in out) == 1, out
    assert sum(o["remote_hits"] for o in out) == 1, out
    info = registry_info()
    assert info is not None and info["handovers"] == 1, info
    with pytest.raises(Exception):  # noqa: B017 - the victim's process died with its node
        ray.get(doomed, timeout=30)
