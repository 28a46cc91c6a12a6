"""The leased remote tier (fa4cache/store/remote.py) over an in-memory transport: two real
stores share kernels through it, and what it does on its own (verify, back off, wait, renew,
count) is what the Ray and torch.distributed tiers do (their transports are tested with
real jobs in tests/ray_integration/ and tests/adapters/distributed/)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fa4cache.store import remote
from fa4cache.store.paths import EntryRef
from fa4cache.store.remote import BUSY, GRANTED, HELD, Check, Copy, LeasedTier, Warn
from fa4cache.store.store import Store
from fa4cache.store.tiers import Artifact
from tests.helpers.fake_compiler import FakeFA4


class Job:
    """What a job's processes share: copies (sidecar, data, uploader) and leases."""

    def __init__(self) -> None:
        self.copies: dict[str, tuple[bytes, bytes, str]] = {}
        self.leases: dict[str, tuple[str, int]] = {}
        self.served: dict[str, int] = {}
        self.down = False
        self.calls = 0
        self.renewed = 0
        self.lock = threading.Lock()

    def call(self) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionError("the job is gone")


JOB = Job()


class MemoryTransport:
    name = "memory"
    peer = "process"
    unreachable = "fa4cache: the memory job is unreachable ({error}); compiling locally (shown once)"
    bad_copy = "fa4cache: {source} sent {kind} entry {digest}, which does not match its key or checksum"

    def __init__(self, root: Path, warn: Warn) -> None:
        self.who = str(root)
        self.connected = False

    def connect(self) -> Any | None:
        JOB.call()
        self.connected = True
        return JOB

    def disconnect(self) -> None:
        self.connected = False

    def fetch(self, ref: EntryRef, check: Check) -> Artifact | None:
        JOB.call()
        got = JOB.copies.get(ref.digest)
        if got is None:
            return None
        art = check(Copy(f"memory {got[2]}", got[0], got[1]))
        if art is not None:
            JOB.served[got[2]] = JOB.served.get(got[2], 0) + 1
        return art

    def offer(self, ref: EntryRef, copy: Callable[[], Artifact | None]) -> bool:
        JOB.call()
        art = copy()
        if ref.digest in JOB.copies or art is None:
            return False
        JOB.copies[ref.digest] = (art.sidecar.to_bytes(), art.data, self.who)
        return True

    def lease(self, digest: str) -> tuple[str, Any]:
        JOB.call()
        with JOB.lock:
            if digest in JOB.copies:
                return HELD, None
            if digest in JOB.leases:
                return BUSY, None
            JOB.leases[digest] = token = (self.who, 0)
            return GRANTED, token

    def wait(self, digest: str, seconds: float, attempt: int) -> None:
        time.sleep(min(seconds, 0.05))

    def renew(self, held: dict[str, Any]) -> dict[str, Any]:
        out = {}
        with JOB.lock:
            for digest, token in held.items():
                if JOB.leases.get(digest) == token:
                    JOB.leases[digest] = out[digest] = (token[0], token[1] + 1)
                    JOB.renewed += 1
        return out

    def release(self, digest: str, token: Any) -> None:
        with JOB.lock:
            if JOB.leases.get(digest) == token:
                del JOB.leases[digest]

    def served(self) -> int | None:
        return JOB.served.get(self.who, 0) if self.connected else None

    def worker_env(self) -> dict[str, str]:
        return {}


class MemoryTier(LeasedTier):
    def __init__(self, root: Path) -> None:
        super().__init__(root, MemoryTransport)


@pytest.fixture(autouse=True)
def job() -> Job:
    global JOB
    JOB = Job()
    return JOB


def _store(root: Path) -> Store:
    return Store.at(root, remote_tier=f"{__name__}:MemoryTier")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_kernel_compiled_by_one_store_loads_in_another_from_its_verified_copy(
    tmp_path: Path, job: Job
) -> None:
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    assert isinstance(a.remote, MemoryTier)
    fa, fb = FakeFA4(a), FakeFA4(b)
    assert fa.call(3, 1) == 4 and fa.compiles == 1
    assert b.remote is not None and job.copies  # offered: read back through a's store
    assert fb.call(3, 1) == 4 and fb.compiles == 0
    assert b.counters.counted("remote_hits") == 1 and b.remote.fetched == 1
    ref = fb.cache.ref(3)
    side = b.read_sidecar(ref)  # taken into b's own directory, with where it came from
    assert side is not None and b.remote.last_source == f"memory {a.root}"
    assert b.serve(ref) is not None and b.serve(ref).data == a.serve(ref).data  # type: ignore[union-attr]
    a.counters.flush()
    assert a.counters.counted("served") == 1  # b's fetch, counted in the uploader's store
    assert not job.leases  # released after the publish


def test_a_copy_that_does_not_match_its_key_or_checksum_is_refused_once(
    tmp_path: Path, job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    fa = FakeFA4(_store(tmp_path / "a"))
    fa.call(5, 0)
    (digest,) = job.copies
    side, data, who = job.copies[digest]
    job.copies[digest] = (side, bytes([data[0] ^ 1]) + data[1:], who)  # same length, one bit
    b = _store(tmp_path / "b")
    fb = FakeFA4(b)
    assert fb.call(5, 0) == 5 and fb.compiles == 1  # compiled here, not loaded
    assert b.counters.counted("remote_hits") == 0
    assert b.read_sidecar(fb.cache.ref(5)).received is None  # type: ignore[union-attr]
    assert b.remote is not None and b.remote.get(fb.cache.ref(5)) is None  # asked again: refused again
    bad = [w for w in _warnings(caplog) if "does not match its key or checksum" in w]
    assert len(bad) == 1, _warnings(caplog)


def test_a_failing_transport_backs_off_and_warns_once(
    tmp_path: Path, job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    b = _store(tmp_path / "b")
    job.down = True
    fb = FakeFA4(b)
    for k in range(3):
        assert fb.call(k, 0) == k
    assert fb.compiles == 3
    assert job.calls == 1  # the first call failed: none after it within RETRY_AFTER
    down = [w for w in _warnings(caplog) if "memory job is unreachable" in w]
    assert len(down) == 1 and "ConnectionError: the job is gone" in down[0], _warnings(caplog)
    assert b.remote is not None and not b.remote.active()


def test_a_held_lease_is_waited_on_until_the_deadline_then_compiled_here(
    tmp_path: Path, job: Job, caplog: pytest.LogCaptureFixture
) -> None:
    tier = _store(tmp_path / "b").remote
    assert tier is not None
    job.leases["d" * 64] = ("another", 0)
    t0 = time.monotonic()
    assert tier.acquire("d" * 64, 0.3) is False
    assert 0.3 <= time.monotonic() - t0 < 5
    waited = [w for w in _warnings(caplog) if "another process has been compiling" in w]
    assert len(waited) == 1, _warnings(caplog)
    assert tier.acquire("d" * 64, 0) is False and len(_warnings(caplog)) == 1  # a try: no warning


def test_a_lease_is_renewed_while_held_and_released_with_its_latest_token(
    tmp_path: Path, job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FA4CACHE_CLUSTER_LEASE", "0.3")  # renewed every 0.1 s
    tier = _store(tmp_path / "b").remote
    assert tier is not None and tier.acquire("e" * 64, 1) is True
    deadline = time.monotonic() + 10
    while job.renewed < 2:
        assert time.monotonic() < deadline, "never renewed"
        time.sleep(0.05)
    assert job.leases["e" * 64][1] >= 2  # a new token each time, and the tier kept it
    tier.release("e" * 64)
    assert "e" * 64 not in job.leases  # ended with the token it holds now
    renewed = job.renewed
    time.sleep(0.35)
    assert job.renewed == renewed  # nothing held: nothing renewed


def test_distributed_picks_the_tier_its_engine_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "_NAMED", {})
    assert Store.at(tmp_path / "a", distributed=True).remote is None  # nothing registered: local only
    remote.register_tier("distributed", MemoryTier)
    assert isinstance(Store.at(tmp_path / "b", distributed=True).remote, MemoryTier)
    assert Store.at(tmp_path / "c").remote is None


def test_a_claim_takes_the_job_wide_lease_without_waiting(tmp_path: Path, job: Job) -> None:
    # What a cold kernel set split across a job's nodes claims with (store.locks.try_claim), over
    # whichever transport the tier has.
    a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
    digest = "f" * 64
    t0 = time.monotonic()
    mine = a.locks.try_claim(digest)
    assert mine is not None and digest in job.leases
    assert b.locks.try_claim(digest) is None  # another node holds it: left for later, no wait
    assert time.monotonic() - t0 < 2
    mine.release()  # ends the node lock and the lease
    assert digest not in job.leases
    theirs = b.locks.try_claim(digest)
    assert theirs is not None
    theirs.release()
