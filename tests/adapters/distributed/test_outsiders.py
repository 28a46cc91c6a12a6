"""Issue 50: only the job's own ranks put bytes into a rank of a torchrun job.

A real ``torchrun`` job (2 ranks, gloo, each rank a "node" with its own store) runs as the
victim (root, the test's own uid); the attacker is an unprivileged user the test creates
(:mod:`tests.store.test_other_users`), with no access to any file of the victim's. It reaches
the job's ``TCPStore`` over 127.0.0.1, as any local user can (the port is in
``/proc/net/tcp``), and is told the namespace, digest and key text, which it could list
(``TCPStore.list_keys``) or compute from public code. Its fake kernel returns
``x + 1000000``: a rank that returns that ran the attacker's object.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.store import test_other_users
from tests.store.test_other_users import ATTACKER, User

people = test_other_users.people  # the victim and attacker users (a module-scoped fixture)

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[3]
PRELOAD = (
    "datetime", "inspect", "json", "torch.distributed", "fa4cache.store.paths", "fa4cache.store.sidecar",
    "fa4cache.adapters.distributed.tier",
)  # fmt: skip

ATTACK = """
import datetime, inspect, json
import torch.distributed as d
import fa4cache.adapters.distributed.tier as t
from fa4cache.store.paths import EntryRef
from fa4cache.store.sidecar import Sidecar

info = json.load(open({job!r}))
client = d.TCPStore(info["host"], info["port"], is_master=False, timeout=datetime.timedelta(seconds=10),
                    wait_for_workers=False)
st = d.PrefixStore(info["prefix"], client)
ref = EntryRef(info["tc"], info["kind"], info["digest"])
data = json.dumps({{"key": 1000000, "fn": "func"}}).encode() * 64  # the attacker's object
side = Sidecar.for_data(ref, data, created=1.0, key=info["key_text"]).to_bytes()  # the real key text
st.set(t.chunk_key(ref.digest, Sidecar.parse(side, ref).sha256, 0), data)
attack = {attack!r}
if attack == "lease":  # a lease that is renewed for ever would stall every waiter
    st.set(t.lease_key(ref.digest), "rank1@x:1:ns 99999999999.000 " + "0" * 64)
elif attack == "plant":  # the best it can sign with: a key from a guessed secret (the default run id)
    if "key" in inspect.signature(t.manifest).parameters:
        from fa4cache.store.auth import from_secret
        m = t.manifest(from_secret(b"none", "guess"), ref.digest, 1, len(data), "rank0@x:1", side)
    else:
        m = t.manifest(1, len(data), "rank0@x:1", side)
else:  # swap: the job's own manifest of this key; forge: of another key; its head kept, own sidecar
    honest = st.get(t.obj_key(info["digest"] if attack == "swap" else info["other_digest"]))
    head = honest.partition(b"\\n")[0].split(b" ")
    head[-3:-1] = [b"1", str(len(data)).encode()]
    m = b" ".join(head) + b"\\n" + side
if attack != "lease":
    st.set(t.obj_key(ref.digest), m)
print("planted", attack)
"""


def _job(base: Path, attack: str, attacker: User, key: int) -> list[dict[str, Any]]:
    """The job, attacked between rank 0's start and the ranks' asking; each rank's result."""
    pub = base / "pub"
    pub.mkdir(parents=True)
    os.chmod(base, 0o755)
    os.chmod(pub, 0o755)
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "FA4CACHE_COMPILE_AHEAD": "0", "OMP_NUM_THREADS": "1",
        "FA4CACHE_JOB_SECRET": secrets.token_hex(16),
    }  # fmt: skip
    env.pop("FA4CACHE_DIR", None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "tests.helpers.dist_worker", "--scenario", "attack", "--attack", attack, "--base", str(base),
        "--offset", str(key),
    ]  # fmt: skip
    job = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (pub / "job.json").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0][-4000:]
            time.sleep(0.1)
        time.sleep(0.2)  # written whole
        p = attacker.run(ATTACK.format(job=str(pub / "job.json"), attack=attack), timeout=60)
        assert p.returncode == 0 and "planted" in p.stdout, p.stderr
        (pub / "go").touch()
        out, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
    files = [base / f"result-{r}.json" for r in (0, 1)]
    assert job.returncode == 0 and all(f.exists() for f in files), out[-6000:]
    return [json.loads(f.read_text()) for f in files]


def _refusals(rank: dict[str, Any]) -> list[str]:
    return [w for w in rank["warnings"] if "not signed by this job" in w]


@pytest.mark.parametrize(
    ("attack", "met"),
    [
        ("plant", 0),  # before the ranks ask: rank 0 meets it first
        ("swap", 1),  # after rank 0's honest upload: rank 1 meets it
        ("forge", 0),  # the MAC of another key's manifest, copied
    ],
)
def test_an_outsider_cannot_put_bytes_into_a_rank(people: Any, attack: str, met: int) -> None:
    _, attacker, base = people
    attacker = User(ATTACKER, attacker.home, preload=PRELOAD)
    key = 40 + met + len(attack)
    ranks = _job(base / f"dist-{attack}", attack, attacker, key)
    for r in ranks:  # nobody ran the attacker's object: every rank's kernel is the real one
        assert r["attack"]["value"] == key, ranks
    victim = ranks[met]
    assert len(_refusals(victim)) == 1, victim["warnings"]  # refused, said once
    assert victim["attack"]["compiles"] == 1, victim  # and compiled here
    other = ranks[1 - met]
    assert len(_refusals(other)) <= 1 and other["attack"]["value"] == key, other
    if attack == "plant":  # rank 0's upload replaced the planted manifest: rank 1 fetched that
        assert other["attack"]["compiles"] == 0 and other["attack"]["remote_hits"] == 1, ranks


def test_an_outsiders_lease_is_not_waited_on(people: Any) -> None:
    """A lease that someone outside the job wrote (and could renew for ever) would make
    every rank wait ``FA4CACHE_LOCK_TIMEOUT`` (600 s) per kernel; it is taken over at once."""
    _, attacker, base = people
    attacker = User(ATTACKER, attacker.home, preload=PRELOAD)
    ranks = _job(base / "dist-lease", "lease", attacker, 60)
    first = ranks[0]["attack"]
    assert first["value"] == 60 and first["compiles"] == 1, ranks
    assert first["seconds"] < 10, first  # not FA4CACHE_CLUSTER_LEASE (30 s), nor the lock timeout
