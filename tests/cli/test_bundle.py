"""``fa4cache bundle`` (fa4cache/cli/bundle.py): export, show and import as the CLI reports them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, run_cli
from tests.helpers.cli_stores import OLD, publish_keyed

_JOB_TOOLCHAIN = """
import sys
from fa4cache.adapters.patch import expected_patches
from fa4cache.adapters.route import job_toolchain
from fa4cache.store.store import Store
from tests.helpers import fake_compiler
fake_compiler.TOOLCHAIN = job_toolchain(expected_patches())  # a kernel stored for this toolchain
fake_compiler.FakeFA4(Store.at(sys.argv[1])).call(1, 0)
print(fake_compiler.TOOLCHAIN.id)
"""


def test_bundle_show_and_import_see_the_gpu_doctor_sees(tmp_path: Path) -> None:
    """On a GPU host with no arch named, ``bundle show``/``import`` said "this machine has no
    target arch (no GPU, ...)" where ``doctor`` found the GPU: they asked torch only if it was
    imported already. The GPU is faked below torch.cuda's device queries
    (tests/helpers/fake_gpu.py): everything fa4cache does to find it is real."""
    clean = {k: v for k, v in os.environ.items() if k not in ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH")}
    clean = {k: v for k, v in clean.items() if k != "FLASH_ATTENTION_NUM_SMS"} | {"PYTHONPATH": str(ROOT)}
    # A kernel for the toolchain jobs on an H200 compile for, the arch named instead of seen.
    src, dst, bundle = tmp_path / "src", tmp_path / "dst", tmp_path / "k.fa4b"
    named = subprocess.run(
        [sys.executable, "-c", _JOB_TOOLCHAIN, str(src)], cwd=ROOT, env={**clean, "FLASH_ATTENTION_ARCH": "sm_90"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    tc = named.stdout.strip()
    assert run_cli(src, "bundle", "export", str(bundle)).returncode == 0

    def on_h200(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tests.helpers.fake_gpu", "--cache-dir", str(dst), *args],
            cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    doc = on_h200("doctor", "--json")
    checks = {c["check"]: c["detail"] for c in json.loads(doc.stdout)["checks"]}
    assert checks["GPU"].startswith("NVIDIA H200 (sm_90)"), checks
    assert checks["target"] == "sm_90, 132 SMs (from the GPU)", checks
    for command in (("bundle", "show", str(bundle)), ("bundle", "import", str(bundle))):
        p = on_h200(*command)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "no target arch" not in p.stdout + p.stderr, (command, p.stdout)
        assert f"1 kernel(s) of toolchain {tc} can serve this host" in p.stdout, (command, p.stdout)
    # Without the fake GPU this machine has none, and the same command says so.
    cpu = subprocess.run(
        [sys.executable, "-m", "fa4cache", "--cache-dir", str(dst), "bundle", "show", str(bundle)],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "this machine has no target arch" in cpu.stdout, cpu.stdout + cpu.stderr


def test_bundle_export_takes_every_toolchain_or_counts_what_it_left_out(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    for i, kind in enumerate(("fwd", "bwd")):
        publish_keyed(d, OLD, kind, i)
    current = "fedcba9876543210fedc"
    for i, kind in enumerate(("rmsnorm_fwd", "cross_entropy_fwd", "fwd"), 10):
        publish_keyed(d, current, kind, i)
    p = run_cli(d, "bundle", "export", str(tmp_path / "all.fa4b"))
    assert p.returncode == 0, p.stderr
    assert "exported 5 entries of 2 toolchain(s)" in p.stdout and "left out" not in p.stdout
    assert f"toolchain {OLD}" in p.stdout and f"toolchain {current}" in p.stdout
    p = run_cli(d, "bundle", "export", "--current", str(tmp_path / "one.fa4b"))
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("left out"))
    other = OLD if f"toolchain {current}" in p.stdout else current
    assert f"({other})" in line and "drop --current" in line
    assert run_cli(d, "bundle", "export", "--all", str(tmp_path / "x.fa4b")).returncode == 0  # old spelling


def test_bundle_show_on_a_directory_or_a_bad_file(tmp_path: Path) -> None:
    d = tmp_path / "c"
    p = run_cli(d, "bundle", "show", str(tmp_path))
    assert p.returncode == 2 and "is a directory, not a bundle file" in p.stderr and ": 3" not in p.stderr
    bad = tmp_path / "bad.fa4b"
    bad.write_bytes(b"not a bundle")
    p = run_cli(d, "bundle", "show", str(bad))
    assert p.returncode == 2 and "not an fa4cache bundle" in p.stderr and "imported" not in p.stderr
    p = run_cli(d, "bundle", "import", str(tmp_path))
    assert p.returncode == 2 and "is a directory, not a bundle file" in p.stderr
