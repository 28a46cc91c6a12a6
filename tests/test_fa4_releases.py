"""The FA4 releases fa4cache supports: each coupling is on only where it was verified, FA4's
new key elements are keyed by value, and 4.0.0b40's compile-miss probe takes no lock.

CI runs this file against every release in the supported range (.ci/run)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import pytest

from fa4cache import fa4_releases
from fa4cache.errors import ConfigError, UnstableKeyError
from fa4cache.fa4_releases import Coupling
from fa4cache.hashing import encode_key
from tests.conftest import ROOT, worker_env

pytest.importorskip("flash_attn.cute")


def test_the_installed_fa4_is_a_verified_release_and_pyproject_admits_exactly_those() -> None:
    inst = fa4_releases.installed()
    assert inst.verified, inst.describe()
    assert inst.release is not None and inst.release.version == inst.version
    text = (ROOT / "pyproject.toml").read_text()
    versions = sorted(fa4_releases.VERSIONS)
    assert f'"flash-attn-4>={versions[0]},<={versions[-1]}"' in text


def test_an_fa4_no_release_lists_gets_fa4s_own_code_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fa4_releases, "RELEASES", ())
    monkeypatch.setattr(fa4_releases, "_said", set())
    fa4_releases._installed.cache_clear()
    try:
        assert [c for c in Coupling if fa4_releases.on(c)] == []
        why = fa4_releases.why_off(Coupling.COMPILE_CACHE)
        assert why is not None and "not verified" in why and "FA4CACHE_TRY_COUPLINGS" in why
        monkeypatch.setenv("FA4CACHE_TRY_COUPLINGS", "interval_masking")
        assert [c for c in Coupling if fa4_releases.on(c)] == [Coupling.INTERVAL_MASKING]
        monkeypatch.setenv("FA4CACHE_TRY_COUPLINGS", "all")
        assert all(fa4_releases.on(c) for c in Coupling)
    finally:
        fa4_releases._installed.cache_clear()


def test_an_unknown_coupling_name_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FA4CACHE_TRY_COUPLINGS", "compile_cache,intervall_masking")
    with pytest.raises(ConfigError, match="FA4CACHE_TRY_COUPLINGS: unknown coupling 'intervall_masking'"):
        fa4_releases._tried()


_UNVERIFIED = """
import json, logging, os
logging.basicConfig(level=logging.WARNING)
from fa4cache import fa4_releases
fa4_releases.RELEASES = ()
import fa4cache
store = fa4cache.install()
from flash_attn.cute import interface as fi
from fa4cache.adapters import patch
from fa4cache.decode import launch_plans
print("RESULT " + json.dumps({
    "routed": patch._installed is not None,
    "fwd_cache": type(fi._flash_attn_fwd.compile_cache).__name__,
    "hash_is_fa4s": fi.utils.hash_callable.__module__ == "flash_attn.cute.utils",
    "plans": launch_plans.enabled(),
}))
"""


def test_install_on_an_unverified_fa4_routes_nothing_and_says_so_once(tmp_path: Any) -> None:
    p = subprocess.run(
        [sys.executable, "-c", _UNVERIFIED],
        cwd=ROOT,
        env=worker_env(tmp_path / "store"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(p.stdout.split("RESULT ", 1)[1])
    assert row == {"routed": False, "fwd_cache": row["fwd_cache"], "hash_is_fa4s": True, "plans": False}
    assert row["fwd_cache"] != "StoreCompileCache"
    said = [line for line in p.stderr.splitlines() if "are not stored" in line]
    assert len(said) == 1 and "not verified" in said[0], p.stderr[-2000:]


# --------------------------------------------------------------------- key elements by value


def _config_classes(module: str) -> tuple[type, type]:
    """A frozen config and a nested one, as if ``module`` defined them (the module decides)."""
    inner = dataclasses.make_dataclass("Registers", [("a", int)], frozen=True)
    cfg = dataclasses.make_dataclass("FwdConfig", [("tile_m", int), ("inner", Any)], frozen=True)
    inner.__module__ = cfg.__module__ = module
    return cfg, inner


def test_fa4s_frozen_configs_are_keyed_by_every_field() -> None:
    cfg, inner = _config_classes("flash_attn.cute.config")
    a = encode_key((cfg(128, inner(1)), "bf16"))
    assert a == encode_key((cfg(128, inner(1)), "bf16"))
    assert a != encode_key((cfg(128, inner(2)), "bf16"))  # a nested field
    assert a != encode_key((cfg(64, inner(1)), "bf16"))
    assert '"tile_m"' in a and "flash_attn.cute.config.FwdConfig" in a


def test_a_config_field_without_a_stable_encoding_refuses_the_key() -> None:
    cfg, _ = _config_classes("flash_attn.cute.config")
    with pytest.raises(UnstableKeyError, match=r"key\[0\]\.inner"):
        encode_key((cfg(128, object()),))


def test_dataclasses_of_other_packages_are_not_keyed_by_value() -> None:
    # Only the fingerprinted packages' classes: their definitions are in the toolchain id.
    cfg, _ = _config_classes("my_training.config")
    with pytest.raises(UnstableKeyError):
        encode_key((cfg(128, 1),))


def test_the_installed_fa4s_forward_config_encodes() -> None:
    config = pytest.importorskip("flash_attn.cute.config")
    if not hasattr(config, "FwdConfig"):
        pytest.skip("this FA4 keys its forward without a FwdConfig (4.0.0b36)")
    fields = {f.name: f for f in dataclasses.fields(config.FwdConfig)}
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            continue
        values[name] = None if name == "registers" else (1 if "int" in str(f.type) else False)
    a = config.FwdConfig(**values)
    b = dataclasses.replace(a, tile_m=a.tile_m + 64)
    assert encode_key((a,)) != encode_key((b,))
    assert encode_key((a,)) == encode_key((config.FwdConfig(**values),))


_TWO_COPIES = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from fa4cache import fingerprint
files = sorted(p.rsplit("/flash_attn/", 1)[0] for p, _, _ in fingerprint._fa4_files())
print(json.dumps({"roots": sorted(set(files)), "digest": fingerprint.fa4_source_digest()}))
"""


def test_the_digest_covers_the_fa4_python_imports_not_every_copy_on_the_path(tmp_path: Any) -> None:
    # flash_attn is a namespace package: a release laid over a venv puts two copies of
    # flash_attn/cute on its path; only the first is imported, and only it is digested.
    for copy, body in (("first", "A = 1\n"), ("second", "A = 2\n")):
        cute = tmp_path / copy / "flash_attn" / "cute"
        cute.mkdir(parents=True)
        (cute / "__init__.py").write_text(body)
    env = worker_env(tmp_path / "store")
    env["PYTHONPATH"] = str(ROOT)

    def run(*copies: str) -> dict[str, Any]:
        p = subprocess.run(
            [sys.executable, "-c", _TWO_COPIES, *(str(tmp_path / c) for c in copies)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)

    both = run("first", "second")
    assert both["roots"] == [str(tmp_path / "first")]
    assert both["digest"] == run("first", "first")["digest"] != run("second", "first")["digest"]


_RECORD = """
import json, os
import fa4cache
from fa4cache.adapters import patch
from fa4cache import fa4_releases
store = fa4cache.install()
tc = patch._installed.toolchain()  # records this FA4's toolchain in the store
print("RESULT " + json.dumps({"version": fa4_releases.installed().version, "toolchain": tc.id}))
"""


def test_a_store_across_an_fa4_upgrade_misses_cleanly_and_doctor_says_why(tmp_path: Any) -> None:
    # This process's FA4 and the venv's own (the overlay of another release taken off the
    # path): run under scripts/test_overlay.sh with the other release, the two differ.
    import os

    env = worker_env(tmp_path / "store", FLASH_ATTENTION_ARCH="sm_90", CUTE_DSL_ARCH="sm_90a")
    venv_only = dict(env)
    venv_only["PYTHONPATH"] = os.pathsep.join(
        p for p in env["PYTHONPATH"].split(os.pathsep) if "/build/overlay/" not in p
    )

    def record(e: dict[str, str]) -> dict[str, Any]:
        p = subprocess.run(
            [sys.executable, "-c", _RECORD], cwd=ROOT, env=e, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.split("RESULT ", 1)[1])

    here, venv = record(env), record(venv_only)
    if here["version"] == venv["version"]:
        pytest.skip("one FA4 release here: run with scripts/test_overlay.sh and another release")
    assert here["toolchain"] != venv["toolchain"]  # every key of one misses under the other
    doctor = subprocess.run(
        [sys.executable, "-m", "fa4cache", "doctor"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    fit = next(line for line in doctor.stdout.splitlines() if "store kernels fit here?" in line)
    assert "no:" in fit and "flash-attn-4" in fit and venv["version"] in fit, doctor.stdout
