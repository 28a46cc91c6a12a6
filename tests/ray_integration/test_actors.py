"""A real local Ray cluster on 127.0.0.1 (two nodes), real compiles in actors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fa4cache.errors import ConfigError

# One Ray cluster at a time on this machine, in a parallel run too.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

CROSS = {"FLASH_ATTENTION_ARCH": "sm_90", "CUTE_DSL_ARCH": "sm_90a", "FLASH_ATTENTION_NUM_SMS": "132"}


# Single-machine mode: every Ray address is 127.0.0.1 (set before Ray is imported).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="module")
def cluster() -> Any:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def _connect(cluster: Any, runtime_env: dict[str, Any]) -> Any:
    import ray

    ray.shutdown()
    assert cluster.address.startswith("127.0.0.1:"), cluster.address
    ray.init(address=cluster.address, runtime_env=runtime_env, log_to_driver=False)
    return ray


def _probe() -> dict[str, Any]:
    import os
    import sys

    import ray

    from fa4cache.store.runtime import installed_store

    s = installed_store()
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "root": str(s.root) if s else None,
        "writable": s.writable if s else None,
        "env_dir": os.environ.get("FA4CACHE_DIR"),
        "fa4_cache_off": os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"),
        "user_hook": os.environ.get("USER_HOOK_RAN"),
        "user_var": os.environ.get("MY_VAR"),
        "interval_masking": os.environ.get("FA4CACHE_INTERVAL_MASKING"),
        "heavy": sorted(m for m in ("torch", "flash_attn") if m in sys.modules),
    }


def _compile_fwd() -> dict[str, Any]:
    from fa4cache.adapters.compile.warm_specs import compile_spec

    from fa4cache.aot.spec import KernelSpec
    from fa4cache.store.runtime import installed_store

    s = installed_store()
    before = dict(s.counters.values)
    compile_spec(KernelSpec(mask="document", backward=False, seqlen=640))
    return {k: s.counters.values[k] - before[k] for k in ("compiles", "disk_hits")}


def test_env_validates_settings() -> None:
    import fa4cache

    with pytest.raises(ConfigError, match="unknown placeholder"):
        fa4cache.env("/tmp/{rack}")
    with pytest.raises(ConfigError, match="absolute path"):
        fa4cache.env("relative/dir")
    with pytest.raises(ConfigError, match="unknown store option"):
        fa4cache.env("/tmp/x", not_an_option=1)
    env = fa4cache.env(
        "/tmp/x-{node_id}", runtime_env={"env_vars": {"MY_VAR": "1", "FA4CACHE_DIR": "/mine"}, "pip": ["x"]}
    )
    assert env["pip"] == ["x"] and env["env_vars"]["MY_VAR"] == "1"
    assert env["env_vars"]["FA4CACHE_DIR"] == "/tmp/x-{node_id}"
    mine = fa4cache.env("/tmp/x", runtime_env={"env_vars": {"FA4CACHE_DIR": "/mine"}}, prefer_user_env=True)
    assert mine["env_vars"]["FA4CACHE_DIR"] == "/mine"


def test_actors_get_settings_node_local_dirs_and_user_hook(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fa4cache

    # A driver-side choice of mask code must reach the workers, or they would ask for
    # (and compile) other kernels than the driver's prewarm did.
    monkeypatch.setenv("FA4CACHE_INTERVAL_MASKING", "0")
    env = fa4cache.env(
        str(tmp_path / "cache-{node_id}"),
        runtime_env={
            "env_vars": {"MY_VAR": "kept", **CROSS},
            "worker_process_setup_hook": "tests.helpers.ray_hooks.mark",
        },
    )
    env["env_vars"]["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    ray = _connect(cluster, env)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    probe = ray.remote(_probe)
    out = ray.get(
        [
            probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
            for n in nodes
        ]
    )
    for o, n in zip(out, nodes):
        assert o["node"] == n
        assert o["root"] == str(tmp_path / f"cache-{n}")  # placeholder resolved in the worker
        assert o["env_dir"] == o["root"]
        assert o["fa4_cache_off"] == "0"
        assert o["user_hook"] == "1" and o["user_var"] == "kept"
        assert o["interval_masking"] == "0"
        assert o["heavy"] == []  # the hook imported neither torch nor FA4
    assert out[0]["root"] != out[1]["root"]
    assert all(Path(o["root"]).is_dir() for o in out)


def test_second_actor_loads_what_the_first_compiled(cluster: Any, tmp_path: Path) -> None:
    import fa4cache

    env = fa4cache.env(str(tmp_path / "shared"), runtime_env={"env_vars": CROSS})
    ray = _connect(cluster, env)

    @ray.remote(num_cpus=1)
    class Trainer:
        def step(self) -> dict[str, Any]:
            return _compile_fwd()

    a = Trainer.remote()
    first = ray.get(a.step.remote())
    b = Trainer.remote()
    second = ray.get(b.step.remote())
    assert first == {"compiles": 1, "disk_hits": 0}
    assert second == {"compiles": 0, "disk_hits": 1}


def test_prewarm_fills_every_node(cluster: Any, tmp_path: Path) -> None:
    from fa4cache.ray_integration import prewarm

    import fa4cache
    from fa4cache.aot.spec import KernelSpec

    env = fa4cache.env(str(tmp_path / "pw-{node_id}"), runtime_env={"env_vars": CROSS})
    ray = _connect(cluster, env)
    spec = KernelSpec(mask="document", backward=False, seqlen=640)
    report = prewarm(
        [spec, {"mask": "document", "backward": False, "head_dim": 96, "seqlen": 640, "heads": 4}]
    )
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert set(report) == set(nodes)
    for node, r in report.items():
        assert r.failed == (), r
        assert r.compiled == 2 and r.cache_dir == str(tmp_path / f"pw-{node}")
    again = prewarm([spec])
    assert all(r.compiled == 0 and r.present == 1 for r in again.values()), again
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    class Trainer:
        def step(self) -> dict[str, Any]:
            return _compile_fwd()

    actors = [
        Trainer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in nodes
    ]
    after = ray.get([a.step.remote() for a in actors])
    assert all(x["compiles"] == 0 for x in after), after
    bad = prewarm([spec], nodes=["f" * 56])
    assert bad["f" * 56].failed == (("*", "node is not alive"),)


def test_unwritable_directory_runs_memory_only_in_the_worker_with_a_warning(
    cluster: Any, tmp_path: Path
) -> None:
    import fa4cache

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="cache_dir=.* is under .*, which is a file; point cache_dir at"):
        fa4cache.env(str(blocker / "cache"))
    with pytest.raises(ConfigError, match="cache_dir=.* is under .*, which is a file .*FA4CACHE_DIR="):
        fa4cache.env(str(blocker / "cache-{node_id}"))  # resolved as in the driver (issue 52 item 4)
    # A node whose disk differs from the driver's: the file appears after env() checked the
    # path. Like Store(), the worker runs with an in-memory cache and says why, instead of
    # dying in its setup hook.
    blocker.unlink()
    env = fa4cache.env(str(blocker / "cache-{node_id}"), runtime_env={"env_vars": CROSS})
    blocker.write_text("not a directory")
    ray = _connect(cluster, env)
    r = ray.get(ray.remote(_probe).options(max_retries=0).remote(), timeout=120)
    assert r["root"] is not None and r["writable"] is False, r
    # The worker's own log names the path and what it means.
    logs = Path(cluster.head_node.get_logs_dir_path())
    text = "".join(p.read_text(errors="replace") for p in logs.glob("*worker*") if p.is_file())
    assert str(blocker) in text and "kernels will not be persisted" in text
