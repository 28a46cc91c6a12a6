"""Issue 38: compile once per torchrun job. Real ``torchrun`` jobs (gloo, CPU); "nodes" are
groups of ranks with their own store directories. The fake compiler where the orchestration
is the point, and one real cross-compiled FA4 forward+backward (tests/helpers/dist_worker.py)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[3]
SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))
SECRET = os.urandom(16).hex()


def torchrun(
    tmp_path: Path, nproc: int, scenario: str, *args: str, timeout: float = 120, **env: str | None
) -> list[dict[str, Any]]:
    """Run ``tests.helpers.dist_worker`` under torchrun; the ranks' RESULT lines, by rank."""
    # "Nodes" have stores of their own: they share through the job's store only under one secret.
    full = {**os.environ, "PYTHONPATH": str(ROOT), "FA4CACHE_COMPILE_AHEAD": "0", "OMP_NUM_THREADS": "1",
            "FA4CACHE_JOB_SECRET": SECRET, **env}  # fmt: skip
    full = {k: v for k, v in full.items() if v is not None and k != "FA4CACHE_DIR"}  # None: unset
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "tests.helpers.dist_worker", "--scenario", scenario, "--base", str(tmp_path), *args,
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    files = [tmp_path / f"result-{r}.json" for r in range(nproc)]
    assert p.returncode == 0 and all(f.exists() for f in files), out[-6000:]
    return [json.loads(f.read_text()) for f in files]


def test_cold_job_compiles_each_kernel_once_and_a_late_node_none(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    offset, keys = rng.randrange(1000), 4
    print(f"seed {SEED}: keys {offset}..{offset + keys - 1}")
    ranks = torchrun(tmp_path, 4, "cold", "--per-node", "2", "--keys", str(keys), "--offset", str(offset))
    # 4 ranks on 2 nodes asked at once: each kernel compiled once in the whole job.
    assert sum(r["cold"]["compiles"] for r in ranks) == keys, ranks
    assert sum(r["cold"]["remote_hits"] for r in ranks) >= keys  # the other node fetched them
    last = ranks[-1]
    assert last["late"]["compiles"] == 0 and last["late"]["remote_hits"] == keys  # a new node, empty store
    assert last["restart"]["compiles"] == 0  # a restart on a node's own store
    # A damaged copy in the job's store: never loaded, compiled locally, one warning.
    assert last["corrupt"]["compiles"] == 1 and last["corrupt"]["remote_hits"] == 1, last
    assert any("does not match its key or checksum" in w for w in last["warnings"]), last["warnings"]
    assert not any("unreachable" in w for r in ranks for w in r["warnings"])


def test_killed_compiler_costs_one_compile_and_nothing_hangs(tmp_path: Path) -> None:
    # The lease holder (a helper on node 0) is SIGKILLed 1.5 s into a 60 s compile; node 1 waits
    # on the lease, takes it over from the dead process and compiles (lease 3 s: a holder on
    # another host would lose it at its deadline).
    ranks = torchrun(tmp_path, 2, "kill", "--seconds", "0.3", FA4CACHE_CLUSTER_LEASE="3")
    waiter = ranks[1]
    assert waiter["kill"]["compiles"] == 1 and waiter["handovers"] == 1, waiter
    assert waiter["waited"] < 10, waiter
    assert ranks[0]["kill"]["compiles"] == 0


def test_torn_down_store_or_group_means_local_compiles(tmp_path: Path) -> None:
    ranks = torchrun(tmp_path, 2, "torn", "--seconds", "0.3", FA4CACHE_CLUSTER_TIMEOUT="3")
    torn = ranks[0]["torn"]
    assert torn.get("compiles") == 3, torn  # one before the store died, two after: all local
    assert torn["seconds"] < 5, torn  # no hang: one failed call, then no store calls
    down = [w for w in torn["warnings"] if "c10d store is unreachable" in w]
    assert len(down) == 1, torn["warnings"]
    # A store server that stops answering (SIGSTOP: connections open, no replies): each
    # call is bounded by FA4CACHE_CLUSTER_TIMEOUT, then one warning and local compiles.
    frozen = ranks[0]["frozen"]
    assert frozen.get("compiles") == 3, frozen
    assert frozen["seconds"] < 3 * 2 + 2, frozen  # at most one timed-out call per miss path, then none
    assert len([w for w in frozen["warnings"] if "c10d store is unreachable" in w]) == 1, frozen
    assert frozen["exit_seconds"] < 30, frozen  # and the process exits without waiting on the store
    for r in ranks:  # after destroy_process_group: the tier is off, misses compile here
        assert r["destroyed"] == {"compiles": 1, "remote": False}, r


def test_split_kernel_set_across_four_nodes(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    offset, keys, nodes = rng.randrange(1000), 8, 4
    print(f"seed {SEED}: keys {offset}..{offset + keys - 1}")
    ranks = torchrun(
        tmp_path, nodes, "split", "--keys", str(keys), "--offset", str(offset), "--seconds", "0.4"
    )
    splits = [r["split"] for r in ranks]
    assert sum(s["compiles"] for s in splits) == keys, splits  # each kernel once, job-wide
    assert all(s["compiles"] + s["remote_hits"] == keys for s in splits), splits
    # Work stealing: about ceil(K / nodes) each (a rank that starts late may claim fewer).
    assert max(s["claimed"] for s in splits) <= math.ceil(keys / nodes) + 2, splits
    assert sum(s["claimed"] > 0 for s in splits) >= 3, splits


@pytest.mark.compile
def test_real_fa4_forward_backward_compiles_once_per_job(tmp_path: Path) -> None:
    ranks = torchrun(tmp_path, 2, "real", timeout=300)
    first, second = (r["real"] for r in ranks)
    assert first["compiles"] + second["compiles"] == 4, ranks  # fwd, bwd_preprocess, bwd, postprocess
    # Each kernel once in the job, whichever rank claimed it (both start together: on a loaded
    # machine the second claims the kernels the first has not reached yet).
    for r in (first, second):
        assert r["compiles"] + r["remote_hits"] == 4, ranks
        assert r["fetch_seconds"] < max(r["remote_hits"], 1) * 0.15, ranks
        assert r["served"] == r["compiles"], ranks  # in `fa4cache stats`' served


_DOCS_RANK = """
import json, os, sys
base, example = sys.argv[1], sys.argv[2]
rank = os.environ["LOCAL_RANK"]
os.environ["FA4CACHE_DIR"] = f"{base}/node-{rank}"  # each rank a node with a store of its own
ns = {"__name__": "__main__"}
exec(compile(open(example).read(), "docs/distributed.md split example", "exec"), ns)
rows = [[r.label, r.compiled, r.present, r.error] for r in ns["report"].rows]
open(f"{base}/result-{rank}.json", "w").write(json.dumps({"rows": rows, "claimed": ns["report"].claimed}))
"""


@pytest.mark.compile
def test_the_docs_split_example_runs_as_written_with_only_the_arch_set(tmp_path: Path) -> None:
    """Issue 52 item 2: docs/distributed.md's split example, as written, under torchrun (gloo)
    on this CPU machine with FLASH_ATTENTION_ARCH=sm_90 alone: every kernel compiled once in
    the job, the rest fetched, and forward-only specs compile no backward kernel."""
    from fa4cache.store.paths import Layout
    from tests.test_docs import python_snippets

    (example,) = [s for s in python_snippets(ROOT / "docs" / "distributed.md") if "split=True" in s]
    (tmp_path / "example.py").write_text(example)
    (tmp_path / "rank.py").write_text(_DOCS_RANK)
    drop = (
        "FLASH_ATTENTION_ARCH",
        "CUTE_DSL_ARCH",
        "FLASH_ATTENTION_NUM_SMS",
        "FA4CACHE_DIR",
        "FA4CACHE_COMPILE_AHEAD",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        FLASH_ATTENTION_ARCH="sm_90", FA4CACHE_JOB_SECRET=SECRET, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(tmp_path / "rank.py"), str(tmp_path), str(tmp_path / "example.py")]  # fmt: skip
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    ranks = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(2)]
    kernels = len(ranks[0]["rows"])  # forward-only specs: one kernel each
    assert sum(c for r in ranks for _, c, _, _ in r["rows"]) == kernels, ranks  # once in the job
    for r in ranks:
        assert all(err is None and c + present == 1 for _, c, present, err in r["rows"]), ranks
        assert sum(c for _, c, _, _ in r["rows"]) == r["claimed"], ranks
    for node in ("node-0", "node-1"):  # each node holds the set, and nothing nobody asked for
        kinds = sorted(e.ref.kind for e in Layout(tmp_path / node).iter_entries())
        assert kinds == ["fwd"] * kernels, (node, kinds)


# -- in one process, no job --------------------------------------------------------------


def test_without_a_process_group_nothing_changes(tmp_path: Path) -> None:
    from fa4cache.adapters.distributed.tier import DistributedTier

    from fa4cache.store.paths import EntryRef
    from fa4cache.store.store import Store

    assert Store.at(tmp_path / "a").remote is None  # off by default
    store = Store.at(tmp_path / "b", distributed=True)
    assert isinstance(store.remote, DistributedTier)
    ref = EntryRef("fa4e000000000000cafe", "fwd", "0" * 64)
    assert store.remote.get(ref) is None and store.remote.acquire(ref.digest, 5) is False
    assert not store.remote.active()
    assert (
        Store.at(tmp_path / "c", distributed=True, remote_tier="os:getcwd").remote is None
    )  # named tier wins


def test_manifest_and_copy_checks() -> None:
    from fa4cache.adapters.distributed.tier import Unsigned, manifest, parse_manifest

    from fa4cache.hashing import key_digest
    from fa4cache.store.auth import from_secret
    from fa4cache.store.paths import EntryRef
    from fa4cache.store.sidecar import Sidecar
    from fa4cache.store.tiers import verify_copy

    job, other = from_secret(b"s" * 32, "test"), from_secret(b"t" * 32, "test")
    d = "ab" * 32
    assert parse_manifest(manifest(job, d, 2, 10, "rank0@h:1", b"{}"), job, d) == (2, 10, "rank0@h:1", b"{}")
    signed = manifest(job, d, 2, 10, "rank0@h:1", b"{}")
    for forged in (
        manifest(other, d, 2, 10, "rank0@h:1", b"{}"),  # another key
        manifest(job, "cd" * 32, 2, 10, "rank0@h:1", b"{}"),  # signed for another digest
        signed.replace(b"{}", b"{ }"),  # anything after the MAC changed
        signed.replace(b" 2 10 ", b" 3 10 "),
        b"FA4D1 2 10 rank0@h:1\n{}",  # the unsigned format
        b"",
    ):
        with pytest.raises(Unsigned):
            parse_manifest(forged, job, d)
    for junk in (b"x 1 s\n{}", b"0 1 s\n", b"1 -5 s\n", b"1 1 s"):  # signed, but malformed
        mac = job.sign("manifest", d.encode(), junk)
        assert parse_manifest(b"FA4D2 " + mac.encode() + b" " + junk, job, d) is None, junk
    tc, key = "fa4e000000000000cafe", "('fwd', 128)"
    ref = EntryRef(tc, "fwd", key_digest(tc, "fwd", key))
    data = b"kernel" * 100
    side = Sidecar.for_data(ref, data, created=1.0, key=key).to_bytes()
    assert verify_copy(ref, side, data, tier="distributed") is not None
    assert verify_copy(ref, side, data[:-1] + b"X", tier="distributed") is None  # checksum
    other = EntryRef(tc, "fwd", key_digest(tc, "fwd", "('fwd', 64)"))
    forged = Sidecar.for_data(other, data, created=1.0, key=key).to_bytes()
    assert verify_copy(other, forged, data, tier="distributed") is None  # key text of another key
    nokey = Sidecar.for_data(ref, data, created=1.0).to_bytes()
    assert verify_copy(ref, nokey, data, tier="distributed") is None


def test_no_library_code_issues_a_collective() -> None:
    # A kernel miss runs inside one rank's forward: a collective there can deadlock the job.
    # Every call of a collective by attribute (dist.barrier(...), torch.distributed.send(...))
    # anywhere in the library, parsed (comments and docstrings do not count).
    import ast

    collectives = {
        "barrier", "monitored_barrier", "all_reduce", "all_gather", "all_gather_into_tensor",
        "all_gather_object", "broadcast", "broadcast_object_list", "reduce_scatter",
        "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list",
        "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
        "send_object_list", "recv_object_list", "new_group", "new_subgroups",
    }  # fmt: skip

    def is_dist(base: ast.expr) -> bool:  # dist, c10d, torch.distributed, ...distributed_c10d
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        return name in ("dist", "c10d", "distributed", "distributed_c10d") or "dist" in name

    found = []
    for top in ("fa4cache", "adapters", "ray_integration"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in collectives and is_dist(node.func.value)):  # fmt: skip
                    found.append(f"{where} {node.func.attr}")
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed"):
                    found += [f"{where} imports {a.name}" for a in node.names if a.name in collectives]
    assert not found, found


def test_doctor_says_which_single_flight_mode(tmp_path: Path) -> None:
    from fa4cache.adapters.distributed.tier import single_flight_mode

    from tests.conftest import run_cli

    p = run_cli(tmp_path, "doctor", env={"FA4CACHE_DISTRIBUTED": "1"})
    line = [x for x in p.stdout.splitlines() if "single-flight" in x]
    assert line and "torch.distributed tier's job-wide leases" in line[0], p.stdout
    assert single_flight_mode(None, False, True, None)[0] == "warn"  # NFS, no job tier: two may compile
    status, words = single_flight_mode(None, True, True, False)
    assert status == "ok" and "without flock" in words and "leases" in words


@pytest.mark.compile
def test_compile_ahead_in_a_job_compiles_each_kernel_once(tmp_path: Path) -> None:
    """With compile-ahead on, each rank's compile server compiles the backward under the
    job's leases and uploads it: the job compiles each kernel once, servers included."""
    from tests.conftest import run_cli

    ranks = torchrun(tmp_path, 2, "real", FA4CACHE_COMPILE_AHEAD="1", timeout=300)
    per_node = []
    for node in (0, 1):
        p = run_cli(tmp_path / f"node-{node}", "stats", "--json")
        assert p.returncode == 0, p.stderr
        per_node.append(json.loads(p.stdout))
    assert sum(s["compiles"] for s in per_node) == 4, (per_node, ranks)  # every process of the job
    assert sum(s["ahead_compiles"] for s in per_node) >= 1, per_node  # a server did compile ahead
    assert sum(r["real"]["remote_hits"] for r in ranks) >= 4, ranks  # the other node fetched all


def test_the_job_key_comes_from_the_setting_or_a_private_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stat

    from fa4cache.store.auth import SECRET_FILE, job_key

    monkeypatch.delenv("FA4CACHE_JOB_SECRET", raising=False)
    root = tmp_path / "store"
    root.mkdir(mode=0o700)
    first, why = job_key(root)
    assert first is not None and not why and str(root) in first.source
    assert stat.S_IMODE((root / SECRET_FILE).stat().st_mode) == 0o600
    again, _ = job_key(root)
    assert again is not None and again.key == first.key  # every process of yours on this store agrees
    (root / SECRET_FILE).chmod(0o640)  # readable by the group: not a secret
    none, why = job_key(root)
    assert none is None and "readable by others" in why
    monkeypatch.setenv("FA4CACHE_JOB_SECRET", "short")
    none, why = job_key(root)
    assert none is None and "FA4CACHE_JOB_SECRET is 5 characters" in why
    monkeypatch.setenv("FA4CACHE_JOB_SECRET", "x" * 32)
    explicit, _ = job_key(root)
    assert explicit is not None and explicit.source == "FA4CACHE_JOB_SECRET" and explicit.key != first.key
    assert "x" * 32 not in repr(explicit)


def test_without_a_job_secret_ranks_compile_locally_and_say_why(tmp_path: Path) -> None:
    ranks = torchrun(tmp_path, 2, "cold", "--keys", "2", "--seconds", "0", FA4CACHE_JOB_SECRET="short")
    for r in ranks:
        assert r["cold"]["compiles"] == 2 and r["cold"]["remote_hits"] == 0, r  # nothing from the store
        said = [w for w in r["warnings"] if "no job secret for the torch.distributed tier" in w]
        assert len(said) == 1 and "fewer than 16" in said[0], r["warnings"]


def test_nodes_with_different_secrets_share_nothing_and_say_so(tmp_path: Path) -> None:
    # No FA4CACHE_JOB_SECRET: each "node" has its own store, so its own job-secret file. Each
    # keeps to its own namespace of the job's store: no refusals, each compiles its kernels.
    ranks = torchrun(tmp_path, 2, "cold", "--keys", "2", "--seconds", "0", FA4CACHE_JOB_SECRET=None)
    assert [r["cold"]["compiles"] for r in ranks] == [2, 2], ranks
    warned = [w for r in ranks for w in r["warnings"]]
    assert not any("not signed by this job" in w for w in warned), warned
    assert any("2 different secrets" in w and "FA4CACHE_JOB_SECRET" in w for w in warned), warned
