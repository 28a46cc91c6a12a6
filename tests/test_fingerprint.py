"""The toolchain fingerprint holds what made the bytes and nothing else; what loading needs is
checked at load; a bundle or store that cannot serve this host says why, naming the field.

What changes the bytes was measured (benchmarks/results/toolchain_bytes.md). The cross-env
test at the bottom runs a second real environment (``FA4CACHE_OTHER_PYTHON``: another
Python, torch build and version), as a CPU machine and a GPU host differ.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fa4cache import fingerprint
from fa4cache.fingerprint import load_problem, toolchain
from tests.conftest import ROOT, run_cli


def test_torch_and_python_are_not_in_the_key_but_the_dsl_flavor_is(monkeypatch: pytest.MonkeyPatch) -> None:
    base = toolchain(90, num_sms=132)
    real_version = fingerprint._version

    def other_torch(dist: str) -> str | None:
        return "2.11.0+cu130" if dist == "torch" else real_version(dist)

    monkeypatch.setattr(fingerprint, "_version", other_torch)
    fingerprint.runtime_facts.cache_clear()
    assert toolchain(90, num_sms=132).id == base.id  # the measured table: same bytes
    assert dict(toolchain(90, num_sms=132).runtime)["torch"] == "2.11.0+cu130"  # recorded, not keyed
    monkeypatch.setattr(fingerprint, "_version", real_version)
    fingerprint.runtime_facts.cache_clear()
    monkeypatch.setattr(fingerprint, "dsl_cuda", lambda: "cu12" if base.dsl_cuda != "cu12" else "cu13")
    assert toolchain(90, num_sms=132).id != base.id  # another ptxas: other device code
    assert "python" not in json.dumps(base.describe()["versions"])


def test_the_dsl_flavor_follows_the_dsls_own_rule(tmp_path: Path) -> None:
    libs = tmp_path / "_mlir_libs"
    libs.mkdir()
    for n in (
        "_cutlass_ir.cu12.cpython-311-x86_64-linux-gnu.so",
        "_cutlass_ir.cu13.cpython-311-x86_64-linux-gnu.so",
    ):
        (libs / n).write_bytes(b"")
    pick = fingerprint._dsl_cuda_from_files
    assert pick(str(libs), None) == "cu13"  # no driver: the newest
    assert pick(str(libs), 12) == "cu12"  # a CUDA 12.9 driver: the newest it supports
    assert pick(str(libs), 13) == "cu13"
    assert pick(str(libs), 11) == "absent"


def test_an_entry_whose_tvm_ffi_abi_differs_is_refused_at_load_naming_it(tmp_path: Path) -> None:
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeFA4

    mine = dict(fingerprint.runtime_facts())
    assert load_problem(mine) is None
    assert load_problem({}) is None  # older entries: as before
    problem = load_problem({**mine, "tvm_ffi_abi": "9.9"})
    assert problem is not None and "tvm-ffi ABI" in problem and "9.9 in the entry" in problem
    # Through the store: the entry is there, its record says another ABI: a miss, counted.
    store = Store.at(tmp_path / "s")
    fa = FakeFA4(store)
    fa.call(3, 0)
    side = next((tmp_path / "s").glob("v2/*/fwd/*.json"))
    meta = json.loads(side.read_text())
    assert meta["built_with"]["tvm_ffi_abi"] == mine["tvm_ffi_abi"]
    meta["built_with"]["tvm_ffi_abi"] = "9.9"
    side.write_text(json.dumps(meta))
    fresh = FakeFA4(Store.at(tmp_path / "s"))
    fresh.call(3, 0)
    assert fresh.compiles == 1
    fresh.cache._inst.store.counters.flush()
    assert fresh.cache._inst.store.counters.values["load_refused"] >= 1  # each look before the compile


def _describe(**changes: Any) -> dict[str, Any]:
    tc = toolchain(90, num_sms=132)
    return {**dataclasses.replace(tc).describe(), **changes}


def test_why_a_toolchain_cannot_serve_names_the_field_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from fa4cache.cli import host_fit

    mine = {"x": _describe()}
    monkeypatch.setattr(host_fit, "host_toolchains", lambda: mine)
    other = "cu12" if mine["x"]["dsl_cuda"] != "cu12" else "cu13"
    why = host_fit.why_not(_describe(dsl_cuda=other), mine, "the bundle")
    assert f"{other!r} in the bundle" in why and "nvidia-cutlass-dsl[cu13]" in why
    why = host_fit.why_not(_describe(arch=100), mine, "the bundle")
    assert "arch 90 here, 100 in the bundle" in why and "(fix: warm with --arch sm_90 for this GPU)" in why
    old = {k: v for k, v in _describe().items() if k != "format"}
    assert "older fa4cache" in host_fit.why_not(old, mine, "the store")
    lines = host_fit.fit_lines({"x": mine["x"], "y": _describe(num_sms=78)}, {"x": 4, "y": 2}, "the bundle")
    assert lines[0] == "4 kernel(s) of toolchain x can serve this host"
    assert "2 kernel(s) of toolchain y cannot serve this host: num_sms 132 here, 78 in the bundle" in lines[1]
    assert "(fix: warm with FLASH_ATTENTION_NUM_SMS=132, this GPU's SM count)" in lines[1], lines[1]
    monkeypatch.setattr(host_fit, "host_toolchains", dict)  # no GPU, no FLASH_ATTENTION_ARCH
    (line,) = host_fit.fit_lines({"x": mine["x"]}, {"x": 4}, "the bundle")
    assert "cannot tell which serve it" in line and "FLASH_ATTENTION_ARCH=sm_90" in line, line


@pytest.mark.compile
def test_bundle_import_and_doctor_say_which_kernels_serve_this_host(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    assert (
        run_cli(src, "warm", "--mask", "causal", "--no-backward", "--head-dim", "64", "-j", "1").returncode
        == 0
    )
    f = tmp_path / "k.fa4b"
    assert run_cli(src, "bundle", "export", str(f)).returncode == 0
    here = run_cli(dst, "bundle", "import", str(f), env={"FLASH_ATTENTION_ARCH": "sm_90"})
    assert (
        here.returncode == 0
        and "1 kernel(s) of toolchain" in here.stdout
        and "can serve this host" in here.stdout
    )
    there = run_cli(dst, "bundle", "show", str(f), env={"FLASH_ATTENTION_ARCH": "sm_100"})
    assert "cannot serve this host: arch 100 here, 90 in the bundle" in there.stdout, there.stdout
    doc = run_cli(dst, "doctor", env={"FLASH_ATTENTION_ARCH": "sm_100"})
    assert "[warn] store kernels fit here?" in doc.stdout and "arch 100 here, 90 in the store" in doc.stdout


OTHER = os.environ.get("FA4CACHE_OTHER_PYTHON")


@pytest.mark.compile
@pytest.mark.skipif(
    not OTHER,
    reason="needs FA4CACHE_OTHER_PYTHON: a second environment with this checkout installed and another "
    "Python / torch (benchmarks/archive/2026-12-03/results/cross_env_cpu.md shows a run)",
)
def test_a_bundle_from_another_environment_compiles_nothing_here(tmp_path: Path) -> None:
    env = dict(os.environ, FA4CACHE_DIR=str(tmp_path / "other"), FLASH_ATTENTION_ARCH="sm_90",
               CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132")  # fmt: skip
    env.pop("PYTHONPATH", None)
    facts = subprocess.run(
        [OTHER, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    mine = f"{sys.version.split()[0]} {__import__('torch').__version__}"
    print(f"other environment: {facts.stdout.strip()}; this one: {mine}")
    assert facts.returncode == 0 and facts.stdout.strip() != mine, facts.stderr
    warm = subprocess.run(
        [OTHER, "-m", "fa4cache", "warm", "--mask", "document", "-j", "1", "-q"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr[-3000:]
    f = tmp_path / "other.fa4b"
    exp = subprocess.run([OTHER, "-m", "fa4cache", "bundle", "export", str(f)], capture_output=True, text=True,
                         env=env, cwd=tmp_path)  # fmt: skip
    assert exp.returncode == 0, exp.stderr
    here = tmp_path / "here"
    assert run_cli(here, "bundle", "import", str(f)).returncode == 0
    again = run_cli(here, "warm", "--mask", "document", "-j", "1")
    assert again.returncode == 0 and "compiled" in again.stdout
    row = next(ln for ln in again.stdout.splitlines() if "document" in ln and "+bwd" in ln)
    assert row.split()[row.split().index("+bwd") + 1] == "0", again.stdout  # compiled 0
    step = subprocess.run(
        [sys.executable, "-m", "tests.helpers.worker", "compile", "--mask", "document"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, FA4CACHE_DIR=str(here), FA4CACHE_COMPILE_AHEAD="0", FLASH_ATTENTION_ARCH="sm_90",
                 CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132", PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    res = json.loads(next(ln for ln in step.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert res["compiles"] == 0 and res["disk_hits"] >= 4, res
