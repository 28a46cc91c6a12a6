"""Ray integration (installed as ``fa4cache.ray_integration``).

``ray.init(runtime_env=fa4cache.env())`` makes every worker of the job use the store:
the runtime_env forwards fa4cache's settings as environment variables and installs
the store in each worker through ``worker_process_setup_hook``. Importing this
module does not import Ray.
"""

from __future__ import annotations

if __name__ != "fa4cache.ray_integration":
    # From the repository root, ``import ray_integration`` would load a second copy of these modules with
    # their own state (installed patches, registries) beside ``fa4cache.ray_integration``.
    raise ImportError(
        f"import fa4cache.ray_integration, not {__name__}: this package is installed as fa4cache.ray_integration"
    )


from fa4cache.ray_integration.prewarm import prewarm
from fa4cache.ray_integration.runtime_env import env

__all__ = ["env", "prewarm"]
