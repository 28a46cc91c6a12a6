"""Build the runtime_env that carries fa4cache into Ray workers."""

from __future__ import annotations

import os
from typing import Any

from fa4cache.ray_integration.hook import ENV_CHAINED_HOOK, ENV_NODE_LOCAL, ChainedHook

from fa4cache.cache_dir import NODE_LOCAL_DEFAULT, PLACEHOLDER, check_cache_dir, check_placeholders
from fa4cache.errors import ConfigError
from fa4cache.settings import BY_NAME, ENV_DIR, Settings

HOOK = "fa4cache.ray_integration.hook.setup"
CLUSTER_TIER = "fa4cache.ray_integration.cluster:ClusterTier"


def _check_dir(raw: str, setting: str) -> None:
    """The store path the workers get, checked here in the driver with the check
    ``install()`` makes (:func:`fa4cache.cache_dir.check_cache_dir`): a bad path fails in
    ``env()``, not as a whole job run memory-only. A path with placeholders is checked with
    this machine's values, for what no node can use (a file in the way); whether a node may
    write there is that node's business (a squatted node-local path falls back)."""
    text = os.path.expanduser(raw)
    check_placeholders(text, setting=setting)
    if not os.path.isabs(text):
        raise ConfigError(f"{setting}: cache directory must be an absolute path, got {raw!r}")
    per_node = PLACEHOLDER.search(text) is not None
    note = f" (the workers' {ENV_DIR}={raw}, placeholders resolved as on this machine)" if per_node else ""
    check_cache_dir(Settings.from_env(text, cache_dir_from=setting), write=not per_node, note=note)


def env(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    node_local: bool = True,
    runtime_env: dict[str, Any] | None = None,
    prefer_user_env: bool = False,
    cluster: bool = False,
    **store_options: Any,
) -> dict[str, Any]:
    """A Ray ``runtime_env`` that makes every worker use the fa4cache store.

    ``cache_dir`` may hold ``{node_id}``, ``{hostname}`` and ``{user}``, resolved in each
    worker. With ``node_local=True`` and no ``cache_dir``, each node uses a local
    directory (``$FA4CACHE_DIR`` if set in the driver, else ``/var/tmp/fa4cache-{user}``).
    ``runtime_env`` is merged, not replaced: its ``env_vars`` are kept (on a name
    clash fa4cache's value wins unless ``prefer_user_env``), and its own
    ``worker_process_setup_hook`` still runs, after fa4cache's. With ``cluster=True`` a
    node's miss asks the other nodes first and each kernel compiles once per cluster
    (:mod:`fa4cache.ray_integration.cluster`).

    Example::

        ray.init(runtime_env=fa4cache.env("/local/nvme/fa4cache-{user}"))
    """
    raw = os.fspath(cache_dir) if cache_dir is not None else os.environ.get(ENV_DIR)
    if raw is None and node_local:
        raw = NODE_LOCAL_DEFAULT
    if raw is not None:
        _check_dir(raw, "cache_dir" if cache_dir is not None else ENV_DIR)
    # Validate the remaining options now (fails at env() time, not in a worker).
    defaults = Settings.from_env("/" if raw is None else "/validate", **store_options)
    ours = {k: v for k, v in defaults.job_env().items() if k != ENV_DIR}
    if raw is not None:
        ours[ENV_DIR] = raw
    if node_local:
        ours[ENV_NODE_LOCAL] = "1"
    if cluster:
        ours[BY_NAME["FA4CACHE_REMOTE_TIER"].name] = CLUSTER_TIER

    merged: dict[str, Any] = dict(runtime_env or {})
    user_env = dict(merged.get("env_vars") or {})
    env_vars = {**user_env, **ours} if not prefer_user_env else {**ours, **user_env}
    user_hook = merged.get("worker_process_setup_hook")
    if user_hook is None or user_hook == HOOK:
        merged["worker_process_setup_hook"] = HOOK
    elif isinstance(user_hook, str):
        env_vars[ENV_CHAINED_HOOK] = user_hook
        merged["worker_process_setup_hook"] = HOOK
    elif callable(user_hook):
        merged["worker_process_setup_hook"] = ChainedHook(user_hook)
    else:
        raise ConfigError(
            f"runtime_env['worker_process_setup_hook']: expected a module path or callable, got {user_hook!r}"
        )
    merged["env_vars"] = {k: str(v) for k, v in env_vars.items()}
    return merged
