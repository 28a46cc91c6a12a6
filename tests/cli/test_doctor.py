"""``fa4cache doctor`` (fa4cache/cli/doctor.py): exit codes, the job's toolchain, missing
packages and settings that ``install()`` would refuse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fa4cache.arch import ARCH_VAR, DSL_ARCH_VAR, NUM_SMS_VAR
from tests.conftest import ROOT, run_cli, worker_env
from tests.helpers.cli_stores import OLD


def test_doctor_names_the_pip_line_for_a_missing_flash_attn_4(tmp_path: Path) -> None:
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.version\n"
        "def version(d):\n"
        "    if d == 'flash-attn-4':\n        raise m.PackageNotFoundError(d)\n"
        "    return real(d)\n"
        "m.version = version\n"
        "from fa4cache.cli import main\n"
        "sys.exit(main(['--cache-dir', sys.argv[1], 'doctor'] + sys.argv[2:]))\n"
    )
    d = tmp_path / "c"
    runs = [
        subprocess.run([sys.executable, "-c", code, str(d), *extra], cwd=ROOT, env=worker_env(d),
                       capture_output=True, text=True, timeout=600)
        for extra in ([], ["--json"])
    ]  # fmt: skip
    text, js = runs
    assert text.returncode == 1 and js.returncode == 1, text.stderr + js.stderr
    line = next(ln for ln in text.stdout.splitlines() if " flash-attn-4 " in ln)
    assert line.startswith("[FAIL]") and "not installed: pip install 'fa4cache[fa4]'" in line, line
    # --json: the same checks, for a fleet's health check to parse.
    rep = json.loads(js.stdout)
    assert rep["ok"] is False and rep["failed"] == 1
    row = next(c for c in rep["checks"] if c["check"] == "flash-attn-4")
    assert row == {
        "status": "FAIL",
        "check": "flash-attn-4",
        "detail": "not installed: pip install 'fa4cache[fa4]'",
    }
    assert len(rep["checks"]) == len(text.stdout.strip().splitlines())
    for c, ln in zip(rep["checks"], text.stdout.strip().splitlines()):
        assert ln.startswith(f"[{c['status']:^4}] {c['check']}") and ln.endswith(c["detail"]), (c, ln)


def test_doctor_fails_a_setting_install_would_refuse(tmp_path: Path) -> None:
    # A newcomer's walk: FA4CACHE_VERIFY_HITS=2 made install() raise, while doctor said every
    # check was ok (exit 0).
    from tests.conftest import run_cli

    for var, value in (("FA4CACHE_VERIFY_HITS", "2"), ("FA4CACHE_COMPILE_AHEAD", "maybe")):
        p = run_cli(tmp_path / "store", "doctor", env={var: value})
        assert p.returncode == 1, p.stdout + p.stderr
        assert any(ln.startswith("[FAIL] setting") and var in ln for ln in p.stdout.splitlines()), p.stdout
    ok = run_cli(tmp_path / "store", "doctor", "--json")
    assert '"check": "settings"' in ok.stdout, ok.stdout


def test_doctor_exits_1_on_a_failed_check_and_names_the_jobs_toolchain(two_toolchains: Path) -> None:
    env = {ARCH_VAR: "", DSL_ARCH_VAR: "", NUM_SMS_VAR: ""}
    p = run_cli(two_toolchains, "doctor", env=env)
    assert p.returncode == 0, p.stdout
    assert f"toolchain (store)            {OLD}" in p.stdout  # the one with kernels, not EMPTY
    assert "toolchain (jobs here)        none (no target)" in p.stdout
    assert f"no GPU and {ARCH_VAR} unset" in p.stdout
    p = run_cli(two_toolchains, "doctor", env={ARCH_VAR: "sm_90", DSL_ARCH_VAR: "sm_90a", NUM_SMS_VAR: "132"})
    assert "target                       sm_90, 132 SMs (from the environment)" in p.stdout
    assert f"not the store's current one {OLD}" in p.stdout
    # ...and why, in words: the fixture's old toolchain has no description of this key format.
    assert "[warn] store kernels fit here?      no: " in p.stdout, p.stdout
    os.chmod(two_toolchains, 0o777)  # world-writable: a failed check
    p = run_cli(two_toolchains, "doctor")
    assert "[FAIL] cache directory" in p.stdout and "writable by group or others" in p.stdout
    assert "directory not created yet" not in p.stdout and p.returncode == 1
