"""Which stored toolchains can serve this host, and in words why the others cannot.

A bundle warmed on a CPU machine is only worth shipping if its kernels were made by the
code generator a job here uses: the same FA4 and QuACK code, DSL version and CUDA flavor,
arch, SM count and patches (:mod:`fa4cache.fingerprint`). ``bundle import``/``show``,
``doctor`` and ``warm`` say so, naming the field, with the fix where there is one.
"""

from __future__ import annotations

from typing import Any

# Fields that are provenance or already implied by others: never a reason to miss.
_NOT_REASONS = ("id", "runtime", "python", "format")
_FIX = {
    "dsl_cuda": "the CUTLASS DSL compiles with the newest CUDA flavor installed that the driver supports: "
    "install the same flavor on both machines (`nvidia-cutlass-dsl[cu13]` for CUDA 13 drivers, plain "
    "`nvidia-cutlass-dsl` (cu12) for CUDA 12 ones)",
    "arch": "warm with --arch sm_{here} for this GPU",
    "num_sms": "warm with FLASH_ATTENTION_NUM_SMS={here}, this GPU's SM count",
    "patches": "both sides need the same FA4CACHE_INTERVAL_MASKING",
}


def host_toolchains() -> dict[str, dict[str, Any]]:
    """The toolchains jobs here compile for (FA4's, and jit/QuACK kernels'), by id; empty
    without a target arch (no GPU and no FLASH_ATTENTION_ARCH). The arch is the one
    ``doctor`` names (:func:`fa4cache.arch.host_arch`)."""
    from fa4cache.adapters.patch import expected_patches
    from fa4cache.adapters.route import job_toolchain
    from fa4cache.arch import host_arch, num_sms_or_none
    from fa4cache.fingerprint import toolchain

    arch = host_arch()
    if arch is None:
        return {}
    out = {}
    for tc in (job_toolchain(expected_patches()), toolchain(arch, num_sms=num_sms_or_none())):
        out[tc.id] = tc.describe()
    return out


def why_not(theirs: dict[str, Any] | None, mine: dict[str, dict[str, Any]], where: str) -> str:
    """Why a toolchain described by ``theirs`` serves none of ``mine``: its differences from
    the closest, in words, with the fix for the first field that has one."""
    if not theirs:
        return f"its description is not recorded in {where}"
    if theirs.get("format") is None:
        return (
            "it was made by an older fa4cache, whose keys this one never looks up: "
            "`fa4cache prune --fingerprint stale` removes it, `fa4cache warm` makes the kernels anew"
        )
    from fa4cache.store.nearmiss import diff

    best: list[tuple[str, Any, Any]] | None = None
    for desc in mine.values():
        diffs = [d for d in diff(desc, theirs) if d[0].split(".")[0] not in _NOT_REASONS]
        if best is None or len(diffs) < len(best):
            best = diffs
    if not best:
        return "the same description under another id (another key format): `fa4cache warm` again here"
    words = "; ".join(f"{k} {here!r} here, {there!r} in {where}" for k, here, there in best[:6])
    fix = next(
        (_FIX[k.split(".")[0]].format(here=here) for k, here, _ in best if k.split(".")[0] in _FIX), None
    )
    return words + (f" (fix: {fix})" if fix else "")


def fit_lines(toolchains: dict[str, dict[str, Any] | None], counts: dict[str, int], where: str) -> list[str]:
    """One line per toolchain of ``where``: whether its kernels serve this host, and why not."""
    try:
        mine = host_toolchains()
    except ImportError as e:  # fa4cache.adapters not importable (a bare source tree on sys.path)
        return [f"cannot tell which kernels serve this host ({e})"]
    if not mine:
        return [
            "this machine has no target arch (no GPU, FLASH_ATTENTION_ARCH unset): cannot tell which serve it "
            "(set FLASH_ATTENTION_ARCH to the GPUs' arch, e.g. FLASH_ATTENTION_ARCH=sm_90, to ask)"
        ]
    lines = []
    for tc, desc in sorted(toolchains.items()):
        n = counts.get(tc, 0)
        if tc in mine:
            lines.append(f"{n} kernel(s) of toolchain {tc} can serve this host")
        else:
            lines.append(
                f"{n} kernel(s) of toolchain {tc} cannot serve this host: {why_not(desc, mine, where)}"
            )
    return lines
