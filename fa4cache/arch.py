"""The one answer to "which GPU": the target arch, its SM count, and a cross-compile's environment.

Every caller (the toolchain fingerprint, mask tiles, warm, the CLI, FA4's hardware
queries on a machine without a GPU) asks here; nothing else parses an arch or reads
``FLASH_ATTENTION_ARCH``. The target is, in this order:

1. ``FLASH_ATTENTION_ARCH`` (else ``CUTE_DSL_ARCH``): a cross-compile, or an explicit choice;
2. the CUDA device's compute capability, when torch is imported and sees one;
3. nothing: :func:`target_arch` raises :class:`NoTargetArch`, naming the variable to set.

Importing this module imports neither torch nor cutlass. Library code asks torch only if the
process imported it already (a job that runs kernels has); a command that says what this
machine is (``doctor``, ``warm``, ``bundle show``/``import``) asks :func:`host_arch` /
:func:`describe`, which import torch first, so that every command gives the same answer on
the same machine whatever it imported before.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from fa4cache.errors import ConfigError

ARCH_VAR = "FLASH_ATTENTION_ARCH"
DSL_ARCH_VAR = "CUTE_DSL_ARCH"
NUM_SMS_VAR = "FLASH_ATTENTION_NUM_SMS"

# Full parts: H100/H200 SXM 132, B200 148, B300 (sm_103) 148.
DEFAULT_NUM_SMS = {90: 132, 100: 148, 103: 148}
# Target arch -> (FLASH_ATTENTION_ARCH, CUTE_DSL_ARCH) for a cross-compile: the one list of
# archs that warm, manifests, the CLI and the Ray prewarm accept.
ARCH_ENV = {
    "sm_90": ("sm_90", "sm_90a"),
    "sm_90a": ("sm_90", "sm_90a"),
    "sm_100": ("sm_100", "sm_100a"),
    "sm_100a": ("sm_100", "sm_100a"),
    "sm_103": ("sm_103", "sm_103a"),
    "sm_103a": ("sm_103", "sm_103a"),
}
ARCHS = tuple(ARCH_ENV)
CROSS_COMPILE_HINT = (
    f"set {ARCH_VAR}=sm_90 (H100/H200) or sm_100 (B200) to cross-compile on this machine "
    f"({DSL_ARCH_VAR} and {NUM_SMS_VAR} then follow from it)"
)

_ARCH_RE = re.compile(r"\s*(?:sm_?)?(\d+)(?:\.(\d+))?[a-z]?\s*")


class NoTargetArch(ConfigError):
    """No GPU is visible and no target arch is named."""


def parse_arch(value: str | int | None) -> int | None:
    """``"sm_90a"`` / ``"sm90"`` / ``"90"`` / ``"9.0"`` / ``90`` -> 90; None for nothing or nonsense."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    m = _ARCH_RE.fullmatch(value.lower())
    if not m:
        return None
    if m.group(2) is not None:
        return int(m.group(1)) * 10 + int(m.group(2))
    return int(m.group(1))


def arch_name(arch: int) -> str:
    return f"sm_{arch}"


def env_arch() -> int | None:
    """The arch named in the environment, if any."""
    return parse_arch(os.environ.get(ARCH_VAR)) or parse_arch(os.environ.get(DSL_ARCH_VAR))


def _torch_cuda() -> Any:
    # Only a torch that is already imported is asked: asking must not cost a torch import.
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch
    except Exception:
        pass
    return None


def gpu_present() -> bool:
    """Whether a CUDA device is usable; imports torch (callers that run kernels have it)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def cuda_devices_visible() -> bool:
    """Whether this process would see an NVIDIA GPU, asked without torch or CUDA (device
    files and ``CUDA_VISIBLE_DEVICES``): a hint for starting work early, never the arch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    try:
        # /dev/nvidiaN on Linux; /dev/dxg where WSL2 passes a GPU through.
        return any((n.startswith("nvidia") and n[6:].isdigit()) or n == "dxg" for n in os.listdir("/dev"))
    except OSError:
        return False


def device_arch(device: Any = None) -> int | None:
    """The compute capability of ``device`` (or the current CUDA device) as an int, else None."""
    if device is not None and getattr(device, "type", None) != "cuda":
        return None
    torch = _torch_cuda()
    if torch is None:
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def resolved_arch(device: Any = None) -> int | None:
    """The target arch, or None when neither the environment nor a GPU names one."""
    return env_arch() or device_arch(device)


def host_arch() -> int | None:
    """:func:`resolved_arch` as a command describing this machine must answer it: with torch
    imported (when installed and no arch is named), so that a GPU is seen even where nothing
    imported torch yet."""
    if env_arch() is None and "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except Exception:  # not installed, or broken: no GPU can be asked
            pass
    return resolved_arch()


def target_arch(device: Any = None) -> int:
    """The target arch; :class:`NoTargetArch` (naming ``FLASH_ATTENTION_ARCH``) when there is none."""
    arch = resolved_arch(device)
    if arch is None:
        raise NoTargetArch(
            f"{ARCH_VAR}: no CUDA GPU is visible here and {ARCH_VAR} is not set; {CROSS_COMPILE_HINT}"
        )
    return arch


def target_num_sms(arch: int | None = None) -> int:
    """The SM count kernels are built for: ``FLASH_ATTENTION_NUM_SMS``, else the GPU's (when it
    is the target), else the target's documented full-part count."""
    text = os.environ.get(NUM_SMS_VAR)
    if text:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n <= 0:
            raise ConfigError(f"{NUM_SMS_VAR}: expected a positive int, got {text!r}")
        return n
    arch = arch if arch is not None else resolved_arch()
    torch = _torch_cuda()
    if torch is not None and (arch is None or arch == device_arch()):
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
    if arch is None:
        raise NoTargetArch(
            f"{ARCH_VAR}: no CUDA GPU is visible here and {ARCH_VAR} is not set; {CROSS_COMPILE_HINT}"
        )
    if arch in DEFAULT_NUM_SMS:
        return DEFAULT_NUM_SMS[arch]
    known = ", ".join(f"sm_{a}: {n}" for a, n in DEFAULT_NUM_SMS.items())
    raise ConfigError(f"{NUM_SMS_VAR}: set it to the SM count of your sm_{arch} GPU (known parts: {known})")


def num_sms_or_none() -> int | None:
    try:
        return target_num_sms()
    except ConfigError:
        return None


def check_arch_name(name: str, *, what: str = "arch") -> str:
    """``name`` if it is a target this package knows, else ConfigError listing them."""
    if name not in ARCH_ENV:
        raise ConfigError(f"{what}: unknown target {name!r}; choose one of {', '.join(ARCHS)}")
    return name


def cross_compile_env(arch: str, num_sms: int | None = None) -> dict[str, str]:
    """The variables FA4 reads (at import) to compile for ``arch`` on a machine without that GPU.

    The SM count is ``num_sms``, else ``FLASH_ATTENTION_NUM_SMS`` when it was set for this same
    arch, else the arch's full part (:data:`DEFAULT_NUM_SMS`).
    """
    fa_arch, dsl_arch = ARCH_ENV[check_arch_name(arch)]
    env = {ARCH_VAR: fa_arch, DSL_ARCH_VAR: dsl_arch}
    same_arch = env_arch() == parse_arch(fa_arch)
    if num_sms is not None:
        env[NUM_SMS_VAR] = str(num_sms)
    elif same_arch and os.environ.get(NUM_SMS_VAR):
        env[NUM_SMS_VAR] = os.environ[NUM_SMS_VAR]
    else:
        env[NUM_SMS_VAR] = str(DEFAULT_NUM_SMS[parse_arch(fa_arch) or 0])
    return env


def describe() -> dict[str, Any]:
    """What this machine targets (:func:`host_arch`), for ``doctor`` and ``warm`` (never raises)."""
    arch = host_arch()
    source = "environment" if env_arch() is not None else ("GPU" if arch is not None else None)
    return {"arch": arch_name(arch) if arch else None, "source": source, "num_sms": num_sms_or_none()}
