"""Cross-compiling FA4 kernels on a machine without the target GPU (or without any GPU).

FA4's persistent tile schedulers (sm_100 forward, sm_90 with some options) ask the CUDA
driver for the SM count while a kernel is traced (``cutlass.utils.HardwareInfo``), and
that number is compiled into the kernel's grid. Without a driver that query fails
(``DynamicLibNotFoundError: "cuda" is an NVIDIA driver library``). When no CUDA device
is usable, :func:`answer_hardware_queries` answers it from ``FLASH_ATTENTION_NUM_SMS``
(which FA4 itself reads for its tile heuristics), or the target's documented default
(:data:`DEFAULT_NUM_SMS`). The SM count is part of the toolchain fingerprint, so a kernel
built for 148 SMs is never served to a part with another count.
"""

from __future__ import annotations

import logging
import os

from fa4cache.tiles import parse_arch

log = logging.getLogger(__name__)

# Full parts: H100/H200 SXM 132, B200 148, B300 (sm_103) 148.
DEFAULT_NUM_SMS = {90: 132, 100: 148, 103: 148}
_PATCHED = "__fa4cache_cross_compile__"


def target_num_sms(arch: int | None) -> int:
    text = os.environ.get("FLASH_ATTENTION_NUM_SMS")
    if text:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n <= 0:
            raise ValueError(f"FLASH_ATTENTION_NUM_SMS: expected a positive int, got {text!r}")
        return n
    if arch in DEFAULT_NUM_SMS:
        return DEFAULT_NUM_SMS[arch]
    raise ValueError(
        f"FLASH_ATTENTION_NUM_SMS: set it to the target GPU's SM count to cross-compile for sm_{arch} "
        f"(documented defaults: {', '.join(f'sm_{a}: {n}' for a, n in DEFAULT_NUM_SMS.items())})"
    )


def gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def answer_hardware_queries() -> int | None:
    """Without a usable CUDA device, make ``HardwareInfo`` answer from the target's SM
    count instead of the driver; returns that count (None when a GPU answers itself)."""
    if gpu_present():
        return None
    import cutlass.utils

    arch = parse_arch(os.environ.get("FLASH_ATTENTION_ARCH"))
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


def device_num_sms() -> int | None:
    """The SM count kernels are built for in this process: the GPU's, or the cross-compile target's."""
    if gpu_present():
        import torch

        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
    try:
        return target_num_sms(parse_arch(os.environ.get("FLASH_ATTENTION_ARCH")))
    except ValueError:
        return None
