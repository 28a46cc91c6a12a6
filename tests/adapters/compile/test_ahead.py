"""Cold starts in parallel, with real processes, real locks and real cross-compiles:
compile-ahead of the backward, waiting processes that help, per-kernel ``warm -j``, and
no worker outliving its parent."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, finish, run_cli, worker_env

pytestmark = pytest.mark.compile

SEED = int(os.environ["FA4CACHE_FUZZ_SEED"])


def cold(cache: Path, action: str, *args: str, ahead: bool = True) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.cold_worker", action, *args],
        cwd=ROOT,
        env=worker_env(cache, FA4CACHE_COMPILE_AHEAD="1" if ahead else "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stats(cache: Path) -> dict[str, Any]:
    p = run_cli(cache, "stats", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def kinds_in_store(cache: Path) -> list[str]:
    return sorted(p.parent.name for p in cache.glob("*/*/*/*.json") if p.parent.name != "stats")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited


def test_forward_only_process_leaves_the_backward_in_the_store(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    T = rng.choice([256, 384, 512, 768])
    print(f"seed {SEED}: seqlen {T}")
    cache = tmp_path / "cache"
    fwd = finish(cold(cache, "forward", "--seqlen", str(T)))
    assert fwd["counters"]["compiles"] == 1  # the forward, in the process itself
    assert "compiling" in fwd["stderr"] and "ahead" in fwd["stderr"]  # the one progress line
    assert {"bwd", "bwd_preprocess", "bwd_postprocess_convert"} <= set(kinds_in_store(cache))
    step = finish(cold(cache, "step", "--seqlen", str(T), ahead=False))
    assert step["counters"]["compiles"] == 0
    assert step["counters"]["disk_hits"] >= 4
    st = stats(cache)
    assert st["ahead_compiles"] == st["entries"] - 1  # every backward kernel ran ahead
    assert st["compiles"] == st["entries"]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_no_worker_outlives_its_parent_killed_with_sigkill(tmp_path: Path) -> None:
    proc = cold(tmp_path / "cache", "hang")
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("WORKERS "):
                pids = json.loads(line[len("WORKERS ") :])
                break
        assert len(pids) >= 2, proc.stderr.read() if proc.stderr else ""  # the server and its workers
        server = pids[0]
        # Kill the parent while a worker is at work: a short kernel's worker may already
        # have finished, so take the tree as it is at that moment.
        deadline = time.monotonic() + 30
        while not (live := [c for c in _children(server) if alive(c)]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert alive(server) and live, "no compile worker at work to kill"
        pids = [server, *live]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 3
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if alive(p)], "compile workers outlived their parent"
    finally:
        proc.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_waiting_process_compiles_the_rest_of_the_set(tmp_path: Path) -> None:
    """Process B finds the forward's lock held (here by the test, standing in for a slow
    compiler) and compiles the backward kernels meanwhile, each through its own lock."""
    from fa4cache.store.locks import KeyLocks, release

    cache = tmp_path / "cache"
    kernels = finish(cold(cache, "plan"))  # FA4's own keys: [kind, digest] in call order
    fwd = [d for kind, d in _planned(kernels) if kind == "fwd"]
    assert len(fwd) == 1
    (cache / "locks").mkdir(parents=True, exist_ok=True)
    lock = KeyLocks(cache / "locks").try_lock(fwd[0])
    assert lock is not None
    proc = cold(cache, "step")
    try:
        deadline = time.monotonic() + 600
        want = {k for k, _ in _planned(kernels) if k != "fwd"}
        while not want <= set(kinds_in_store(cache)):
            assert proc.poll() is None and time.monotonic() < deadline, "no help while waiting"
            time.sleep(0.2)
        assert "fwd" not in kinds_in_store(cache)
    finally:
        release(lock)
    res = finish(proc)
    c = res["counters"]
    assert c["ahead_compiles"] == len(_planned(kernels)) - 1
    assert c["compiles"] == len(_planned(kernels))  # each once, all in B
    assert c["lock_waits"] == 1


def _planned(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, d) for k, d in result["rows"]]


def test_concurrent_cold_processes_compile_each_kernel_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    procs = [cold(cache, "step", "--wait-file", str(go)) for _ in range(4)]
    time.sleep(1)
    go.touch()
    results = [finish(p) for p in procs]
    st = stats(cache)
    assert st["entries"] == 4  # fwd, bwd preprocess, bwd, postprocess
    assert st["compiles"] == st["entries"], results
    assert sum(r["counters"]["compiles"] for r in results) + st["ahead_compiles"] >= st["compiles"]


def test_warm_jobs_spread_the_kernels_of_one_spec(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096,
             "torch_dtype": "bfloat16"}
        )
    )  # fmt: skip
    p = run_cli(cache, "warm", "--hf-config", str(cfg), "-j", "2")
    assert p.returncode == 0, p.stderr
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("bf16"))
    compiled, present = map(int, row.split()[-5:-3])
    st = stats(cache)
    assert compiled == st["entries"] == st["compiles"] == 5, p.stdout
    assert present == 0
    assert st["processes"] >= 2  # both workers compiled
    again = run_cli(cache, "warm", "--hf-config", str(cfg), "-j", "2")
    row = next(ln for ln in again.stdout.splitlines() if ln.startswith("bf16"))
    assert list(map(int, row.split()[-5:-3])) == [0, 5], again.stdout


_SERVER_WARM = """
import json, sys
import fa4cache
from fa4cache.adapters.compile import server as compile_server
from fa4cache.aot.spec import KernelSpec

compile_server.can_fork = lambda: False  # what a GPU host answers: this process may not fork
started = []
Real = compile_server.CompileServer


class Counted(Real):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        started.append(self.pid)


compile_server.CompileServer = Counted
spec = KernelSpec(heads=int(sys.argv[2]), heads_kv=1, backward=True, seqlen=256)
report = fa4cache.warm([spec], sys.argv[1], jobs=int(sys.argv[3]))  # the plan names the target
out = [{"error": r.error, "compiles": r.compiled} for r in report.rows]
print("RESULT " + json.dumps({"out": out, "servers": started, "fa4_here": "flash_attn.cute" in sys.modules}))
"""


def test_warm_jobs_on_a_gpu_host_fork_from_one_server(tmp_path: Path) -> None:
    """Where warm may not fork from itself (a GPU process), one GPU-blind server imports FA4
    once and forks the -j workers: every kernel compiled once, by several workers."""
    rng = random.Random(SEED)
    heads, jobs = rng.choice([2, 4, 8]), rng.choice([2, 3])
    print(f"seed {SEED}: heads {heads}, -j {jobs}")
    cache = tmp_path / "cache"
    p = subprocess.run(
        [sys.executable, "-c", _SERVER_WARM, str(cache), str(heads), str(jobs)],
        cwd=ROOT, env=worker_env(cache), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT ") :])
    assert len(res["servers"]) == 1 and not res["fa4_here"]  # FA4 imported once, in the server
    (spec,) = res["out"]
    st = stats(cache)
    assert spec["error"] is None and spec["compiles"] == st["entries"] == st["compiles"] == 5, res
    assert st["processes"] >= 2  # the kernels were spread over the forked workers


def _entries(cache: Path) -> dict[tuple[str, str], str]:
    """(kind, digest) -> sha256 of every entry in the store."""
    out = {}
    for p in cache.glob("*/*/*/*.json"):
        if p.parent.name != "stats":
            side = json.loads(p.read_text())
            out[(side["kind"], side["digest"])] = side["sha256"]
    return out


@pytest.mark.parametrize("told", ["at the first miss", "once the process starts CUDA"])
def test_a_server_started_at_install_compiles_the_bytes_the_process_would(tmp_path: Path, told: str) -> None:
    """On a GPU host the server starts at install(), importing FA4 before it knows the
    target, and is told the target as soon as this process has started CUDA, else at the
    first miss: its kernels must be the ones this process would compile itself, byte for byte
    (same keys, same toolchain, same target)."""
    rng = random.Random(SEED)
    T = rng.choice([256, 512, 768])
    print(f"seed {SEED}: seqlen {T}, told {told}")
    early = tmp_path / "early"
    up = ["--cuda-up"] if told.endswith("CUDA") else []
    fwd = finish(cold(early, "forward", "--seqlen", str(T), "--gpu-host", *up))
    assert fwd["server_at_install"]
    assert fwd["configured_before_step"] == bool(up)
    assert fwd["counters"]["compiles"] == 1  # the forward, in the process itself
    st = stats(early)
    assert st["ahead_compiles"] == st["entries"] - 1 == 3  # the backward: by the server's workers
    alone = tmp_path / "alone"
    step = finish(cold(alone, "step", "--seqlen", str(T), ahead=False))
    assert step["counters"]["compiles"] == 4
    assert _entries(early) == _entries(alone)
    # A rank that finds its kernels stored starts no server beside it, at install or later.
    warm = finish(cold(early, "step", "--seqlen", str(T), "--gpu-host"))
    assert not warm["server_at_install"] and warm["worker_pids"] == [], warm
    assert warm["counters"]["compiles"] == 0 and warm["counters"]["disk_hits"] == 4


def test_in_a_job_the_server_learns_its_target_at_the_first_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's configuration carries the job's leases (its remote tier's variables), which
    exist once the process group is up: where the store has a job-wide tier, the watcher leaves
    the configuration to the first miss, however early CUDA is up."""
    import types

    import torch
    from fa4cache.adapters.compile import ahead

    from fa4cache.store import runtime

    told: list[dict[str, str]] = []
    server = types.SimpleNamespace(
        proc=types.SimpleNamespace(poll=lambda: None), configured=False, configure=told.append
    )
    monkeypatch.setattr(ahead, "_server", server)
    monkeypatch.setattr(ahead, "server_env", lambda: {"FA4CACHE_DIR": "x"})
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    for remote in (object(), None):
        store = types.SimpleNamespace(remote=remote)
        monkeypatch.setattr(runtime, "installed_store", lambda store=store: store)
        ahead._configure_when_cuda_is_up(server)  # type: ignore[arg-type]
    assert told == [{"FA4CACHE_DIR": "x"}]  # without a job-wide tier only


def test_a_forward_call_hands_its_backward_to_the_running_server_before_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backward, the step's slowest kernel, starts as the forward call starts (not after the
    forward's key, lookup and lock), once per call shape and server; the forward's miss then
    hands nothing more over, and a new server is handed it again."""
    import types

    from fa4cache.adapters.compile import ahead
    from fa4cache.adapters.fa4.events import MissEvent, MissStage

    from fa4cache.store import runtime

    order: list[str] = []
    submitted: list[Any] = []

    def server() -> Any:
        return types.SimpleNamespace(
            proc=types.SimpleNamespace(poll=lambda: None),
            submit=lambda task: (order.append("submitted"), submitted.append(task)),
            close=lambda wait: None,
        )

    running = server()
    monkeypatch.setattr(ahead, "_server", running)
    monkeypatch.setattr(ahead, "_sent", set())
    monkeypatch.setattr(ahead, "_get_server", lambda: ahead._server)
    monkeypatch.setattr(ahead, "enabled", lambda: True)
    store = types.SimpleNamespace(writable=True, counters=types.SimpleNamespace(counted=lambda name: 0))
    monkeypatch.setattr(runtime, "installed_store", lambda: store)
    monkeypatch.setattr(runtime, "current_toolchain", lambda: types.SimpleNamespace(id="tc"))
    jobs = {64: "job-d64", 128: "job-d128"}
    monkeypatch.setattr(ahead, "backward_job", lambda args, kwargs: jobs[args[0]])

    def fa4_forward(d: int) -> str:
        order.append("forward ran")
        # FA4 misses on the forward kernel inside the call: nothing is handed over again
        ref = types.SimpleNamespace(digest="f" * 64)
        ahead._on_miss(MissEvent(MissStage.COMPILING, "fwd", None, ref))  # type: ignore[arg-type]
        return "out"

    forward = ahead.wrap_forward(fa4_forward)
    assert forward(64) == "out" and forward(64) == "out"
    assert order[:2] == ["submitted", "forward ran"] and len(submitted) == 1, order
    assert submitted[0].jobs == ("job-d64",) and submitted[0].ahead
    forward(128)  # another shape: its own backward
    assert [t.jobs for t in submitted] == [("job-d64",), ("job-d128",)]
    ahead._retire_server()  # a server that left took what it was handed with it
    monkeypatch.setattr(ahead, "_server", server())
    forward(64)
    assert [t.jobs for t in submitted][-1] == ("job-d64",) and len(submitted) == 3


def test_a_head_start_that_cannot_be_given_never_costs_the_forward_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A setting that does not parse, a server that died, a server that refuses the task: the
    forward call runs as without compile-ahead, a dead server is not started again by a call
    that may miss nothing, and a refused backward is handed over at the next call."""
    import types

    from fa4cache.adapters.compile import ahead

    from fa4cache.store import runtime

    accepted: list[Any] = []
    answer = {"accept": False}
    started: list[bool] = []

    def submit(task: Any) -> bool:
        if answer["accept"]:
            accepted.append(task)
        return answer["accept"]

    alive = types.SimpleNamespace(
        proc=types.SimpleNamespace(poll=lambda: None), submit=submit, close=lambda wait: None
    )
    dead = types.SimpleNamespace(
        proc=types.SimpleNamespace(poll=lambda: -9), submit=submit, close=lambda wait: None
    )
    monkeypatch.setattr(ahead, "_sent", set())
    monkeypatch.setattr(ahead, "_get_server", lambda: started.append(True) or ahead._server)
    store = types.SimpleNamespace(writable=True, counters=types.SimpleNamespace(counted=lambda name: 0))
    monkeypatch.setattr(runtime, "installed_store", lambda: store)
    monkeypatch.setattr(runtime, "current_toolchain", lambda: types.SimpleNamespace(id="tc"))
    monkeypatch.setattr(ahead, "backward_job", lambda args, kwargs: "job")
    monkeypatch.setattr(ahead, "_misses", itertools.count().__next__)  # every call compiles
    forward = ahead.wrap_forward(lambda: "out")

    monkeypatch.setattr(ahead, "_server", dead)
    assert forward() == "out" and started == []  # no server started by the call itself
    monkeypatch.setattr(ahead, "_server", alive)
    monkeypatch.setenv("FA4CACHE_COMPILE_AHEAD", "maybe")
    assert forward() == "out"  # (the setting's error is the miss path's to report)
    monkeypatch.setenv("FA4CACHE_COMPILE_AHEAD", "1")
    assert forward() == "out" and accepted == []  # refused
    answer["accept"] = True
    assert forward() == "out" and [t.jobs for t in accepted] == [("job",)]  # handed over again
    assert forward() == "out" and len(accepted) == 1
    # After a forward that compiled nothing, the next call (another shape) waits for its miss.
    monkeypatch.setattr(ahead, "_misses", lambda: 0)
    forward()  # (the same shape, handed over already: it compiles nothing)
    monkeypatch.setattr(ahead, "backward_job", lambda args, kwargs: "another shape's job")
    forward()
    assert len(accepted) == 1
