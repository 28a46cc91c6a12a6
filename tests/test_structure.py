"""Issue 11: the bugs the old structure caused, and the layering rule that prevents them."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from fa4cache.errors import ConfigError, UnstableKeyError

from .conftest import ROOT, run_cli

CORE = ROOT / "fa4cache"
# The application layer (these files and the cli/ package, which the glob below does not
# reach) may reach adapters (lazily); core modules may not.
TOP_LAYER = {"__init__.py", "__main__.py"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names.add("." * node.level + mod)
            names |= {f"{'.' * node.level}{mod}.{a.name}" for a in node.names}
    return names


def test_no_core_module_imports_adapters_or_ray_integration() -> None:
    offenders = {}
    for path in sorted(CORE.glob("*.py")):
        if path.name in TOP_LAYER:
            continue
        bad = {n for n in _imports(path) if "adapters" in n or "ray_integration" in n}
        if bad:
            offenders[path.name] = sorted(bad)
    assert not offenders, f"core modules importing adapters: {offenders}"


def _template_module(tmp_path: Path, name: str, window: str) -> object:
    tmp_path.mkdir()
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            import fa4cache

            WINDOW = {window}

            @fa4cache.mask_template
            def banded(causal: bool):
                def mask_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
                    return (n_idx <= m_idx) & (n_idx > m_idx - WINDOW)
                return mask_mod
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def test_mask_hash_changes_with_a_global_value_it_reads(tmp_path: Path) -> None:
    # The same module name in both: only the value of WINDOW differs.
    a = _template_module(tmp_path / "a", "tmpl_window", "256")
    ha = a.banded(causal=True).__cute_hash__  # type: ignore[attr-defined]
    b = _template_module(tmp_path / "b", "tmpl_window", "512")
    hb = b.banded(causal=True).__cute_hash__  # type: ignore[attr-defined]
    c = _template_module(tmp_path / "c", "tmpl_window", "256")
    hc = c.banded(causal=True).__cute_hash__  # type: ignore[attr-defined]
    assert ha != hb, "WINDOW=256 and WINDOW=512 must not share a kernel"
    assert ha == hc, "the same source and values must give the same hash"


def test_a_global_value_without_stable_encoding_is_refused(tmp_path: Path) -> None:
    mod = _template_module(tmp_path / "d", "tmpl_obj", "object()")
    with pytest.raises(UnstableKeyError, match="WINDOW"):
        mod.banded(causal=True)  # type: ignore[attr-defined]


def test_prune_stale_judges_by_recorded_use_not_by_this_shells_environment(tmp_path: Path) -> None:
    from fa4cache.settings import Settings
    from fa4cache.store import Store

    from .fake_compiler import FakeFA4

    store = Store(Settings.from_env(tmp_path / "c"))
    FakeFA4(store).call(1, 0)  # the job's toolchain, used just now
    # A shell with other code-generation knobs than the job computes another toolchain id.
    p = run_cli(tmp_path / "c", "prune", "--fingerprint", "stale", env={"CUTE_DSL_EXTRA_KNOB": "1"})
    assert p.returncode == 0, p.stderr
    assert len(list(store.layout.iter_entries())) == 1, p.stdout


def test_every_flag_setting_parses_the_same_words(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from fa4cache.blocksparse import _use_triton
    from fa4cache.masks import make_document_mask

    cuda_like = type("CudaTensor", (), {"is_cuda": True})()
    monkeypatch.setenv("FA4CACHE_TRITON", "false")
    assert not _use_triton(cuda_like, (128, 128), None)
    monkeypatch.setenv("FA4CACHE_TRITON", "off")
    assert not _use_triton(cuda_like, (128, 128), None)
    monkeypatch.setenv("FA4CACHE_INTERVAL_MASKING", "garbage")
    with pytest.raises(ConfigError, match="FA4CACHE_INTERVAL_MASKING"):
        make_document_mask(torch.tensor([0, 3]))
    monkeypatch.setenv("FA4CACHE_INTERVAL_MASKING", "no")
    assert not hasattr(make_document_mask(torch.tensor([0, 3])).mask_mod, "__fa4cache_row_intervals__")
    monkeypatch.setenv("FA4CACHE_LOCK_TIMEOUT", "nan")
    from fa4cache.settings import Settings

    with pytest.raises(ConfigError, match="FA4CACHE_LOCK_TIMEOUT"):
        Settings.from_env("/tmp/x")


def test_readme_table_and_fa4cache_env_come_from_the_one_declaration(tmp_path: Path) -> None:
    from fa4cache.settings import SETTINGS, markdown_table

    assert markdown_table() in (ROOT / "README.md").read_text()
    p = run_cli(tmp_path / "c", "env", env={"FA4CACHE_TRITON": "0", "FA4CACHE_MAX_SIZE": "2G"})
    assert p.returncode == 0, p.stderr
    out = dict(line.split("=", 1) for line in p.stdout.splitlines())
    assert out["FA4CACHE_TRITON"] == "0" and out["FA4CACHE_MAX_SIZE"] == str(2 << 30)
    assert set(out) <= {s.name for s in SETTINGS} | {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"}
    bad = run_cli(tmp_path / "c", "env", env={"FA4CACHE_TRITON": "maybe"})
    assert bad.returncode == 2 and "FA4CACHE_TRITON" in bad.stderr


def test_toolchain_names_the_host_cpu_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from fa4cache.fingerprint import toolchain

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    x86 = toolchain(90)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    arm = toolchain(90)
    assert x86.id != arm.id and arm.describe()["machine"] == "aarch64"
