"""Cross-compiling FA4 kernels on a machine without the target GPU (or without any GPU).

FA4's persistent tile schedulers (sm_100 forward, sm_90 with some options) ask the CUDA
driver for the SM count while a kernel is traced (``cutlass.utils.HardwareInfo``), and
that number is compiled into the kernel's grid. Without a driver that query fails
(``DynamicLibNotFoundError: "cuda" is an NVIDIA driver library``). When no CUDA device
is usable, :func:`answer_hardware_queries` answers it from ``FLASH_ATTENTION_NUM_SMS``
(which FA4 itself reads for its tile heuristics), or the target's documented default
(:data:`fa4cache.arch.DEFAULT_NUM_SMS`). The SM count is part of the toolchain fingerprint, so a kernel
built for 148 SMs is never served to a part with another count.
"""

from __future__ import annotations

import logging
import os

from fa4cache.arch import ARCH_VAR, CROSS_COMPILE_HINT, env_arch, gpu_present, target_num_sms

log = logging.getLogger(__name__)

_PATCHED = "__fa4cache_cross_compile__"
NO_TARGET_WARNING = f"no CUDA GPU is visible and {ARCH_VAR} is not set, so FA4 cannot run or compile here; {CROSS_COMPILE_HINT}"


def answer_hardware_queries() -> int | None:
    """Without a usable CUDA device, make ``HardwareInfo`` answer from the target's SM
    count instead of the driver; returns that count (None when a GPU answers itself)."""
    if gpu_present():
        return None
    import cutlass.utils

    arch = env_arch()
    if arch is None:
        # Nothing will compile here (no GPU, no target): FA4 itself says so when called.
        log.warning("fa4cache: %s", NO_TARGET_WARNING)
        return None
    num_sms = target_num_sms(arch)
    # FA4's own heuristics read the same number from here.
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", str(num_sms))
    cls = cutlass.utils.HardwareInfo
    if getattr(cls, _PATCHED, None) == num_sms:
        return num_sms
    original_init = getattr(cls, "__fa4cache_original_init__", cls.__init__)

    def __init__(self, *args: object, **kwargs: object) -> None:  # no driver to open
        self.device_id = kwargs.get("device_id", 0)

    cls.__fa4cache_original_init__ = original_init
    cls.__init__ = __init__
    cls.get_device_multiprocessor_count = lambda self: num_sms
    # A cluster of n CTAs occupies n SMs: at most num_sms // n clusters are resident.
    cls.get_max_active_clusters = lambda self, cluster_size=1: num_sms // max(int(cluster_size), 1)
    setattr(cls, _PATCHED, num_sms)
    log.info("fa4cache: no CUDA device; FA4 kernels are traced for %d SMs (sm_%s)", num_sms, arch)
    return num_sms
