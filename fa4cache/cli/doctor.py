"""``fa4cache env`` and ``fa4cache doctor``: the environment a job needs, and what is wrong
with this one."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..extras import pip_line
from ..settings import Settings
from .common import human, settings_of


def cmd_env(args: argparse.Namespace) -> int:
    s = settings_of(args)
    env = s.job_env()
    for k in sorted(env):
        if args.shell:
            import shlex

            print(f"export {k}={shlex.quote(env[k])}")
        else:
            print(f"{k}={env[k]}")
    return 0


@dataclass(frozen=True)
class Check:
    """One line of ``fa4cache doctor``: ``[status] what  detail``; ``FAIL`` makes the exit 1."""

    status: str  # ok, info, warn, FAIL
    what: str
    detail: str


@dataclass
class _Report:
    """The checks made so far, and what later checks need from earlier ones: the store the
    workers would use, and whether it is usable."""

    settings: Settings
    usable: bool = True
    checks: list[Check] = field(default_factory=list)

    def __call__(self, status: str, what: str, detail: str) -> None:
        self.checks.append(Check(status, what, detail))

    @property
    def problems(self) -> int:
        return sum(c.status == "FAIL" for c in self.checks)


def cmd_doctor(args: argparse.Namespace) -> int:
    line = _Report(settings_of(args))
    for check in CHECKS:
        check(line)
    if getattr(args, "json", False):
        rows = [{"status": c.status, "check": c.what, "detail": c.detail} for c in line.checks]
        print(json.dumps({"ok": not line.problems, "failed": line.problems, "checks": rows}, indent=2))
    else:
        for c in line.checks:
            print(f"[{c.status:^4}] {c.what:<28} {c.detail}")
    return 1 if line.problems else 0


def _settings(line: _Report) -> None:
    """Every FA4CACHE_ variable that is set, read as ``install()`` reads it: a value it would
    refuse is a FAIL here too (doctor passed FA4CACHE_VERIFY_HITS=2, which install() refuses)."""
    import os

    from fa4cache.errors import ConfigError
    from fa4cache.settings import SETTINGS

    bad = []
    for s in SETTINGS:
        if s.name in os.environ:
            try:
                s.read(os.environ)
            except (ConfigError, ValueError) as e:
                bad.append(str(e))
    if bad:
        for msg in bad:
            line("FAIL", "setting", msg)
    else:
        n = sum(s.name in os.environ for s in SETTINGS)
        line("ok", "settings", f"{n} FA4CACHE_ variable(s) set, each one valid")


def _versions(line: _Report) -> None:
    from importlib import metadata

    from ..fingerprint import DISTRIBUTIONS

    for d in DISTRIBUTIONS:
        try:
            line("ok", d, metadata.version(d))
        except metadata.PackageNotFoundError:
            needed = d in ("flash-attn-4", "nvidia-cutlass-dsl", "torch")
            line(
                "FAIL" if needed else "info",
                d,
                f"not installed: {pip_line(d)}" if needed else "not installed",
            )


def _fa4_couplings(line: _Report) -> None:
    """Which couplings to FA4's internals are on for the installed FA4, and why the others are off."""
    from .. import fa4_releases

    inst = fa4_releases.installed()
    if inst.version is None:
        return
    line("ok" if inst.verified else "warn", "flash-attn-4 release", inst.describe())
    for c in fa4_releases.Coupling:
        why = fa4_releases.why_off(c, inst)
        line("ok" if why is None else "info", f"  {c.value}", "on" if why is None else f"off: {why}")


def _gpu(line: _Report) -> None:
    try:
        import torch

        if torch.cuda.is_available():
            cap = torch.cuda.get_device_capability()
            line(
                "ok",
                "GPU",
                f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}), {torch.cuda.device_count()} device(s)",
            )
        else:
            line("info", "GPU", "none: kernels can still be cross-compiled (fa4cache warm)")
    except Exception as e:
        line("info", "GPU", f"unknown ({type(e).__name__}: {e})")


def _cache_directory(line: _Report) -> None:
    """The store the workers would use (a squatted node-local path: the fallback), and
    whether it is usable (kept in ``line`` for the checks after it)."""
    from fa4cache.cache_dir import cache_dir_error, cache_dir_problem
    from fa4cache.store.root import resolve_root

    s = line.settings
    try:
        root, _ = resolve_root(s, lambda tag, msg: None)
    except OSError as e:  # InsecurePath, or a file in the way: the setting and the fix
        line("FAIL", "cache directory", str(cache_dir_error(s, cache_dir_problem(s.cache_dir) or str(e))))
        line.usable = False
        return
    shown = str(root) if root == s.cache_dir else f"{root} (instead of {s.cache_dir}, not safe to use)"
    line("ok", "cache directory", shown)
    line.settings = s.with_cache_dir(root)


def _target_and_toolchains(line: _Report) -> None:
    from fa4cache.adapters.patch import expected_patches
    from fa4cache.adapters.route import job_toolchain
    from fa4cache.arch import ARCH_VAR, CROSS_COMPILE_HINT, describe
    from fa4cache.store.paths import Layout

    from ..settings import setting

    s = line.settings
    target = describe()
    if target["arch"] is None:
        line(
            "info",
            "target",
            f"none: no GPU and {ARCH_VAR} unset, so jobs here cannot compile; {CROSS_COMPILE_HINT} "
            "(`fa4cache warm` takes --arch)",
        )
    else:
        line("ok", "target", f"{target['arch']}, {target['num_sms']} SMs (from the {target['source']})")
    recent = Layout(s.cache_dir).most_recent_toolchain()
    mine = job_toolchain(expected_patches()).id if target["arch"] is not None else None
    if mine is None:
        jobs = "none (no target)"
    elif recent is None:
        jobs = f"{mine} (the store holds no kernels yet)"
    elif mine == recent:
        jobs = f"{mine} = the store's current one: jobs here load its kernels"
    else:
        jobs = f"{mine}, not the store's current one {recent}"
    line("info", "toolchain (jobs here)", jobs)
    if mine is not None and recent is not None and mine != recent:
        from fa4cache.store.nearmiss import toolchain_description
        from fa4cache.store.secure_io import only_me

        from .host_fit import host_toolchains, why_not

        theirs = toolchain_description(s.cache_dir, recent, only_me())
        line("warn", "store kernels fit here?", f"no: {why_not(theirs, host_toolchains(), 'the store')}")
    line(
        "info",
        "toolchain (store)",
        f"{recent or 'none recorded yet'}: the most recently used one that holds kernels (stats, ls, prune)",
    )
    from .. import fa4_releases

    unverified = fa4_releases.why_off(fa4_releases.Coupling.INTERVAL_MASKING)
    if not setting("FA4CACHE_INTERVAL_MASKING"):
        masking = "off (FA4CACHE_INTERVAL_MASKING=0)"
    elif unverified:
        masking = f"off ({unverified})"
    else:
        masking = "on"
    line(
        "info",
        "interval masking",
        f"{masking}; patches FA4's Hopper (sm_90) kernels only, other archs unchanged",
    )


def _filesystem(line: _Report) -> None:
    import shutil
    import stat as _stat

    from fa4cache.store.fsinfo import NETWORK_FS, lock_works, mount_for

    s, usable = line.settings, line.usable
    root = s.cache_dir if s.cache_dir.exists() else s.cache_dir.parent
    mnt, fstype = mount_for(root)
    line("warn" if fstype in NETWORK_FS else "ok", "filesystem", f"{fstype} at {mnt}")
    if usable and s.cache_dir.exists():  # never a lock probe in a directory that is not ours
        st = os.lstat(s.cache_dir)
        mode = _stat.S_IMODE(st.st_mode)
        own = hasattr(os, "getuid") and st.st_uid == os.getuid()
        line(
            "ok" if own and not mode & 0o022 else "FAIL",
            "permissions",
            f"mode {mode:o}, {'owned by you' if own else f'owner uid {st.st_uid}'}",
        )
        ok, detail = lock_works(s.cache_dir)
        line("ok" if ok else "FAIL", "file locks", detail)
    else:
        ok = None
    from fa4cache.adapters.distributed.tier import single_flight_mode

    status, detail = single_flight_mode(s.remote_tier, s.distributed, fstype in NETWORK_FS, ok)
    line(status, "single-flight", detail)
    if usable and not s.cache_dir.exists():
        line("info", "permissions", "directory not created yet")
    try:
        du = shutil.disk_usage(root)
        line("ok" if du.free > 1 << 30 else "warn", "free space", human(du.free))
    except OSError as e:
        line("warn", "free space", str(e))


def _fa4_own_cache(line: _Report) -> None:
    if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1":
        line(
            "warn",
            "FA4 own cache",
            "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1: fa4cache replaces it; unset it to avoid storing kernels twice",
        )
    else:
        line("ok", "FA4 own cache", "off (fa4cache handles persistence)")


# What `fa4cache doctor` checks, in order: each adds its lines to the report (a check may
# read what an earlier one kept there: the store and whether it is usable).
CHECKS: tuple[Callable[[_Report], None], ...] = (
    _settings,
    _versions,
    _fa4_couplings,
    _gpu,
    _cache_directory,
    _target_and_toolchains,
    _filesystem,
    _fa4_own_cache,
)
