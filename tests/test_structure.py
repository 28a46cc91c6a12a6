"""The bugs the old structure caused, and the layering rule that prevents them."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from fa4cache.errors import ConfigError, UnstableKeyError
from tests.conftest import ROOT, run_cli

# The layers, lowest first: a module may import its own layer and the ones below, never above
# (function-level imports included). The package face (fa4cache/__init__) resolves lazily.
LAYERS = (
    ("fa4cache.errors", "fa4cache.cache_dir", "fa4cache.settings", "fa4cache.hashing", "fa4cache.arch", "fa4cache.validate", "fa4cache.version",
     "fa4cache.fingerprint", "fa4cache.extras", "fa4cache.identity", "fa4cache.fa4_releases",
     "fa4cache.patched_code", "fa4cache.dict_versions"),
    ("fa4cache.store", "fa4cache.warmth"),
    ("fa4cache.masks",),
    ("fa4cache.ops", "fa4cache.decode", "fa4cache.aot"),
    ("fa4cache.adapters",),
    ("fa4cache.ray_integration",),
    ("fa4cache.cli", "fa4cache.__main__"),
)  # fmt: skip


def _report() -> Any:
    """scripts/structure_report.py: the one import graph the report and these checks share."""
    spec = importlib.util.spec_from_file_location(
        "structure_report", ROOT / "scripts" / "structure_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("structure_report", module)
    spec.loader.exec_module(module)
    return module


_graph = _report()
PACKAGE_DIRS = _graph.PACKAGE_DIRS


def _modules() -> dict[str, Path]:
    return _graph.modules()


def _project_imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    return _graph.imports(name)


def _layer(name: str) -> int:
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (rank, len(p))
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[0]


def test_nothing_imports_upward() -> None:
    mods = _modules()
    offenders = []
    for name, path in mods.items():
        if name == "fa4cache":  # the lazy package face
            continue
        for dep in _project_imports(name, path, mods):
            if dep != "fa4cache" and _layer(dep) > _layer(name):
                offenders.append(f"{name} -> {dep}")
    assert not offenders, "upward imports: " + ", ".join(sorted(offenders))


def _strings(tree: ast.AST) -> list[str]:
    """The string constants of a module, its docstrings left out (prose may name any layer)."""
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def _upward_strings(name: str, source: str, mods: Iterable[str]) -> list[str]:
    """Modules of a higher layer than ``name`` that its code names in a string that is a
    reference (a module, ``module:Class``, an f-string's ``fa4cache.pkg.`` head), not prose (a
    message that tells the user which function to call): an import the import graph cannot see."""
    known = set(mods)
    found = []
    for text in _strings(ast.parse(source)):
        ref = re.fullmatch(r"(fa4cache(?:\.\w+)+)\.?(?::\w*)?", text.strip())
        if ref is not None:
            dotted = ref.group(1)
            parts = dotted.split(".")
            target = next(
                (".".join(parts[:i]) for i in range(len(parts), 1, -1) if ".".join(parts[:i]) in known), None
            )
            if target is not None and _layer(target) > _layer(name):
                found.append(f"{name} -> {dotted!r}")
    return found


def test_nothing_names_a_higher_layer_in_a_string() -> None:
    # The store once named the torch.distributed tier as "fa4cache.adapters....:DistributedTier":
    # an upward arrow no import showed. Engines register their tiers from their own side.
    mods = _modules()
    offenders = [
        o
        for name, path in mods.items()
        if name != "fa4cache"
        for o in _upward_strings(name, path.read_text(), mods)
    ]
    assert not offenders, "upward references by string: " + ", ".join(sorted(offenders))


def test_the_string_check_sees_a_module_class_name() -> None:
    mods = ("fa4cache.store.store", "fa4cache.adapters.distributed.tier")
    source = 'X = "fa4cache.adapters.distributed.tier:DistributedTier"\n'
    assert _upward_strings("fa4cache.store.store", source, mods) == [
        "fa4cache.store.store -> 'fa4cache.adapters.distributed.tier'"
    ]
    assert _upward_strings(
        "fa4cache.store.store",
        'f"fa4cache.adapters.distributed.{x}"\n',
        mods + ("fa4cache.adapters.distributed",),
    )
    # Docstrings and messages may name any layer; a lower layer may be named anywhere.
    doc = '"""See fa4cache.adapters.distributed.tier."""\nY = "fa4cache.store.store"\nZ = "see fa4cache.adapters.distributed.tier"\n'
    assert _upward_strings("fa4cache.adapters.distributed.tier", doc, mods) == []
    assert _upward_strings("fa4cache.store.store", doc, mods) == []


def test_no_import_circles() -> None:
    # A package's face re-exporting its own modules is not a circle of peers (graph() drops it).
    assert _graph.circles(_graph.graph()) == []


def test_the_structure_report_runs_and_counts_the_graph() -> None:
    p = subprocess.run(
        [sys.executable, "scripts/structure_report.py", "--json"], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    import json

    r = json.loads(p.stdout)
    assert r["import_circles"] == [] and r["modules"] == len(_modules())
    chain = r["adapters_longest_chain"]
    assert len(chain) == r["adapters_floors"] >= 2
    assert all(b in _graph.graph()[a] for a, b in zip(chain, chain[1:]))  # a real chain of imports


def test_a_circle_is_found_when_there_is_one() -> None:
    assert _graph.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_adapters_cannot_load_twice_under_another_name() -> None:
    for top in ("adapters", "ray_integration"):
        p = subprocess.run([sys.executable, "-c", f"import {top}"], cwd=ROOT, capture_output=True, text=True)
        assert p.returncode != 0 and f"import fa4cache.{top}" in p.stderr, p.stderr


def test_no_module_parses_an_arch_but_fa4cache_arch() -> None:
    offenders = []
    for name, path in _modules().items():
        if name == "fa4cache.arch":
            continue
        text = path.read_text()
        for needle in (
            'environ.get("FLASH_ATTENTION_ARCH")',
            "def parse_arch",
            "DEFAULT_NUM_SMS = ",
            "ARCH_ENV = ",
        ):
            if needle in text:
                offenders.append(f"{name}: {needle}")
    assert not offenders, offenders


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


def test_a_global_value_without_stable_encoding_is_never_keyed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mod = _template_module(tmp_path / "d", "tmpl_obj", "object()")
    with caplog.at_level(logging.WARNING, logger="fa4cache"):
        mask = mod.banded(causal=True)  # type: ignore[attr-defined]
    assert not hasattr(mask, "__cute_hash__")  # no key for FA4's own cache either
    assert "in memory only" in caplog.text and "WINDOW" in caplog.text
    with pytest.raises(UnstableKeyError, match="WINDOW"):
        mod.banded.hash_for(causal=True)  # type: ignore[attr-defined]


def test_prune_stale_judges_by_recorded_use_not_by_this_shells_environment(tmp_path: Path) -> None:
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeFA4

    store = Store.at(tmp_path / "c")
    FakeFA4(store).call(1, 0)  # the job's toolchain, used just now
    # A shell with other code-generation knobs than the job computes another toolchain id.
    p = run_cli(tmp_path / "c", "prune", "--fingerprint", "stale", env={"CUTE_DSL_EXTRA_KNOB": "1"})
    assert p.returncode == 0, p.stderr
    assert len(list(store.layout.iter_entries())) == 1, p.stdout


def test_every_flag_setting_parses_the_same_words(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from fa4cache.masks import make_document_mask
    from fa4cache.masks.blocksparse import _use_triton

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


def test_settings_page_and_fa4cache_env_come_from_the_one_declaration(tmp_path: Path) -> None:
    import importlib.util

    from fa4cache.settings import DSL_CACHES_OFF, SETTINGS, markdown_table

    # The docs' settings reference is generated from the declaration at build time
    # (scripts/docs_hooks.py, run by mkdocs; tests/test_docs.py builds the site).
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert markdown_table() in hooks.settings_page((ROOT / "docs" / "settings.md").read_text())
    p = run_cli(tmp_path / "c", "env", env={"FA4CACHE_TRITON": "0", "FA4CACHE_MAX_SIZE": "2G"})
    assert p.returncode == 0, p.stderr
    out = dict(line.split("=", 1) for line in p.stdout.splitlines())
    assert out["FA4CACHE_TRITON"] == "0" and out["FA4CACHE_MAX_SIZE"] == str(2 << 30)
    assert set(out) <= {s.name for s in SETTINGS} | set(DSL_CACHES_OFF)
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


def test_the_architecture_page_names_every_module_once() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## Layout") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    listed: list[str] = []
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        name = line.strip().split(" ")[0]
        if not name or not (name.endswith(".py") or name.endswith("/")):
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "".join(p for _, p in stack) + name
        if name.endswith("/"):
            stack.append((indent, name))
        else:
            listed.append(path)
    modules = sorted(
        str(p.relative_to(ROOT))
        for d in PACKAGE_DIRS.values()
        for p in d.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
        or p.parent.name in ("masks", "cli")
        or p.parent == ROOT / "fa4cache"
    )
    missing = sorted(set(modules) - set(listed))
    assert not missing, f"modules docs/architecture.md's layout does not name: {missing}"
    assert len(listed) == len(set(listed)), "a module named twice"


@pytest.mark.parametrize(
    "env, arch",
    [
        ({"FLASH_ATTENTION_ARCH": "sm_90"}, 90),
        ({"FLASH_ATTENTION_ARCH": "sm_90a"}, 90),
        ({"FLASH_ATTENTION_ARCH": "9.0"}, 90),
        ({"CUTE_DSL_ARCH": "sm_100a"}, 100),
        ({"FLASH_ATTENTION_ARCH": "sm_103"}, 103),
        ({}, None),
    ],
)
def test_one_arch_answer_for_the_cli_warm_tiles_and_the_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], arch: int | None
) -> None:
    from fa4cache import arch as arch_mod
    from fa4cache.fingerprint import toolchain
    from fa4cache.masks.tiles import DEFAULT_MASK_ARCH, target_arch

    for var in ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert arch_mod.resolved_arch() == arch  # no torch imported here: no GPU answers
    assert toolchain().arch == arch
    assert target_arch() == (arch or DEFAULT_MASK_ARCH)  # masks built where nothing names a target
    cli_env = {"FLASH_ATTENTION_ARCH": "", "CUTE_DSL_ARCH": "", "FLASH_ATTENTION_NUM_SMS": "", **env}
    out = run_cli(tmp_path / "c", "doctor", env=cli_env).stdout
    if arch is None:
        with pytest.raises(arch_mod.NoTargetArch, match="FLASH_ATTENTION_ARCH"):
            arch_mod.target_arch()
        assert "target                       none: no GPU and FLASH_ATTENTION_ARCH unset" in out
    else:
        assert arch_mod.target_arch() == arch
        sms = arch_mod.DEFAULT_NUM_SMS[arch]
        assert f"target                       sm_{arch}, {sms} SMs" in out
        # warm's cross-compile environment for the same arch names it the same way.
        warm_env = arch_mod.cross_compile_env(f"sm_{arch}")
        assert arch_mod.parse_arch(warm_env["FLASH_ATTENTION_ARCH"]) == arch
        assert warm_env["FLASH_ATTENTION_NUM_SMS"] == str(sms)


def test_the_compile_face_gives_its_functions_after_their_modules_load() -> None:
    # A face name equal to a submodule's name would turn into that module once the
    # submodule is imported (the import system binds it on the package).
    import types

    import fa4cache.adapters.compile as face

    for name in face.__all__:
        importlib.import_module(face._FACE[name])
        assert not isinstance(getattr(face, name), types.ModuleType), name
        assert name not in {m.rsplit(".", 1)[1] for m in face._FACE.values()}, name


# ------------------------------------------------------------------ every module has a test

# Modules that had neither a test importing them nor a test file named after them when this
# check was added (issue 51). Frozen: a new module without a test fails the first test below,
# and a module that gets a test (or goes) must leave this list (the second), so it only shrinks.
# Most are reached only through a package face (``fa4cache.masks``), a child process or
# another module; a test that imports one directly takes it off the list.
# One string, not a string per name: the finder counts a module named in full in a string
# (``python -m``) as tested, and would count these.
UNTESTED_TODAY = frozenset(
    """
    fa4cache.adapters.compile.generation
    fa4cache.adapters.compile.rebuild_check
    fa4cache.adapters.compile.worker
    fa4cache.adapters.distributed.split
    fa4cache.adapters.fa4.cross_compile
    fa4cache.adapters.fa4.dsl_caches
    fa4cache.adapters.fa4.import_hook
    fa4cache.adapters.patch
    fa4cache.adapters.transformers.common
    fa4cache.adapters.transformers.fallback
    fa4cache.adapters.transformers.models
    fa4cache.cli.common
    fa4cache.cli.store_commands
    fa4cache.masks.builtins
    fa4cache.masks.draft
    fa4cache.masks.template
    fa4cache.decode.split_kv_triton
    fa4cache.ops.packed_attention
    fa4cache.ops.sequence_add_triton
    fa4cache.ray_integration.admin
    fa4cache.ray_integration.node_server
    fa4cache.ray_integration.registry
    fa4cache.ray_integration.runtime_env
    fa4cache.ray_integration.tier
    fa4cache.store.root
    """.split()  # noqa: SIM905 (see the comment above)
)


def _untested(modules: set[str], test_files: list[Path]) -> list[str]:
    """The modules no test file imports (anywhere in its body; ``from pkg import mod`` counts for
    ``pkg.mod``), names in full in a string (``python -m``, ``import_module``), or is named
    after (``test_<last name>.py`` or ``test_<last name>_*.py``)."""
    imported: set[str] = set()
    for f in test_files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported |= ({node.module} | {f"{node.module}.{a.name}" for a in node.names}) & modules
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names} & modules
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
                imported.add(node.value)
    return sorted(m for m in modules if m not in imported and not _has_test_file(m, test_files))


def _mirror(module: str) -> tuple[tuple[str, ...], str]:
    """Where the tests of ``module`` live, under tests/: ``fa4cache.X.Y`` (``adapters/X/Y.py`` is
    ``fa4cache.adapters.X.Y``) in ``X/test_Y.py``, or ``X/test_Y_<feature>.py``; a package's
    own module (``fa4cache/masks/__init__.py``) in ``masks/test_masks.py``."""
    parts = module.split(".")[1:] or ["fa4cache"]
    mods = _modules()
    package = module in mods and mods[module].name == "__init__.py"
    return tuple(parts if package else parts[:-1]), parts[-1]


def _has_test_file(module: str, test_files: list[Path]) -> bool:
    folder, leaf = _mirror(module)
    tests = ROOT / "tests"
    for f in test_files:
        top = tests if f.is_relative_to(tests) else f.parent  # a finder test's own folder
        if f.parent == top.joinpath(*folder) and (
            f.stem == f"test_{leaf}" or f.stem.startswith(f"test_{leaf}_")
        ):
            return True
    return False


def _test_files() -> list[Path]:
    return sorted(ROOT.glob("tests/**/test_*.py")) + sorted(ROOT.glob("tests/**/conftest.py"))


def test_every_module_has_a_test_that_imports_it_or_a_test_file_named_after_it() -> None:
    untested = _untested(set(_modules()), _test_files())
    print(f"modules with neither a test importing them nor a test file named after them ({len(untested)}):")
    print("\n".join(untested))
    new = sorted(set(untested) - UNTESTED_TODAY)
    assert not new, f"modules without a test: {new}; add tests/<package>/test_<module>.py or import it in one"


def test_the_list_of_untested_modules_only_shrinks() -> None:
    untested = set(_untested(set(_modules()), _test_files()))
    gone = sorted(UNTESTED_TODAY - untested)
    assert not gone, f"these now have a test or no longer exist: remove them from UNTESTED_TODAY: {gone}"


def test_the_untested_module_finder_sees_imports_strings_and_names(tmp_path: Path) -> None:
    mods = {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.f"}
    (tmp_path / "test_x.py").write_text(
        textwrap.dedent(
            """
            from p import a
            import p.b

            def test_late():
                from p.c import thing
                run(["python", "-m", "p.d"])
            """
        )
    )
    # Named after p.e; p.f only inside a longer string (an attribute path), which does not count.
    (tmp_path / "test_e_more.py").write_text("x = 'p.f.attr'\n")
    found = _untested(mods, sorted(tmp_path.glob("test_*.py")))
    assert found == ["p.f"], found


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    # pyproject lists the packages by name: a new package left out installs in an editable
    # checkout and is missing from the wheel (fa4cache.decode was, found on the H200's install).
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    roots = {
        "fa4cache": "fa4cache",
        "adapters": "fa4cache.adapters",
        "ray_integration": "fa4cache.ray_integration",
    }
    found = set()
    for folder, name in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed, (sorted(found - listed), sorted(listed - found))


# Modules without a test file of their own in the mirror (issue 51, item 5); each is tested from
# a feature file, a whole-job test or its package's face, or (UNTESTED_TODAY) not at all yet.
# One string, as UNTESTED_TODAY (see there).
NO_TEST_FILE = frozenset(
    """
    fa4cache
    fa4cache.__main__
    fa4cache.adapters
    fa4cache.adapters.compile
    fa4cache.adapters.compile.generation
    fa4cache.adapters.compile.rebuild_check
    fa4cache.adapters.compile.server
    fa4cache.adapters.compile.split
    fa4cache.adapters.compile.task
    fa4cache.adapters.compile.warm_jit_calls
    fa4cache.adapters.compile.warm_specs
    fa4cache.adapters.compile.worker
    fa4cache.adapters.distributed
    fa4cache.adapters.distributed.split
    fa4cache.adapters.distributed.tier
    fa4cache.adapters.fa4
    fa4cache.adapters.fa4.artifacts
    fa4cache.adapters.fa4.compile_cache
    fa4cache.adapters.fa4.cross_compile
    fa4cache.adapters.fa4.dsl_caches
    fa4cache.adapters.fa4.events
    fa4cache.adapters.fa4.import_hook
    fa4cache.adapters.fa4.interval_masking
    fa4cache.adapters.fa4.keys
    fa4cache.adapters.fa4.mask_tiles
    fa4cache.adapters.jit.quack
    fa4cache.adapters.patch
    fa4cache.adapters.route
    fa4cache.adapters.transformers.attention
    fa4cache.adapters.transformers.common
    fa4cache.adapters.transformers.fallback
    fa4cache.adapters.transformers.masks
    fa4cache.adapters.transformers.models
    fa4cache.aot
    fa4cache.aot.jit_spec
    fa4cache.aot.model_config
    fa4cache.aot.spec
    fa4cache.arch
    fa4cache.cli.common
    fa4cache.cli.host_fit
    fa4cache.cli.progress
    fa4cache.cli.store_commands
    fa4cache.cli.warm_jit
    fa4cache.cli.warm_plan
    fa4cache.decode.kv_cache
    fa4cache.decode.observe
    fa4cache.decode.one_row_sdpa
    fa4cache.decode.paged
    fa4cache.decode.plan
    fa4cache.decode.split_kv_triton
    fa4cache.decode.step_ranges
    fa4cache.masks.builtins
    fa4cache.masks.draft
    fa4cache.masks.intervals
    fa4cache.masks.template
    fa4cache.masks.tiles
    fa4cache.masks.varlen
    fa4cache.ops
    fa4cache.ops.attention
    fa4cache.ops.packed_attention
    fa4cache.ops.sequence_add_triton
    fa4cache.ops.step_mask
    fa4cache.ops.varlen_calls
    fa4cache.ray_integration
    fa4cache.ray_integration.admin
    fa4cache.ray_integration.hook
    fa4cache.ray_integration.node_server
    fa4cache.ray_integration.prewarm
    fa4cache.ray_integration.registry
    fa4cache.ray_integration.runtime_env
    fa4cache.ray_integration.tier
    fa4cache.store.auth
    fa4cache.store.fsinfo
    fa4cache.store.locks
    fa4cache.store.maintenance
    fa4cache.store.paths
    fa4cache.store.root
    fa4cache.store.runtime
    fa4cache.store.secure_io
    fa4cache.store.sidecar
    fa4cache.store.stats
    fa4cache.store.tiers
    fa4cache.validate
    fa4cache.warmth
    """.split()  # noqa: SIM905 (see UNTESTED_TODAY)
)


def test_every_module_has_a_test_file_where_the_tests_mirror_the_code() -> None:
    # tests/ mirrors the packages (docs/index.md, "Tests"): a module's tests are found in
    # tests/<its package>/test_<its name>[_<feature>].py. Modules tested only from a feature
    # file elsewhere (a whole-job test, the CLI's) are listed in NO_TEST_FILE; the list only
    # shrinks: a module that gains its file must leave it, and a new module needs its file.
    missing = {m for m in _modules() if not _has_test_file(m, _test_files())}
    print(f"modules without a test file of their own ({len(missing)}):")
    print("\n".join(sorted(missing)))
    assert not sorted(missing - NO_TEST_FILE), "add tests/<package>/test_<module>.py for these"
    assert not sorted(NO_TEST_FILE - missing), "these have a test file now: remove them from NO_TEST_FILE"


def test_the_mirror_finds_a_modules_file_by_package_and_name() -> None:
    files = [
        ROOT / "tests/store/test_bundle.py",
        ROOT / "tests/decode/test_split_kv.py",
        ROOT / "tests/test_identity_forms.py",
    ]
    assert _has_test_file("fa4cache.store.bundle", files)
    assert _has_test_file("fa4cache.identity", files)  # test_identity_<feature>.py
    assert not _has_test_file("fa4cache.cli.bundle", files)  # another package's file of that name
    split = ".".join(("fa4cache.adapters.distributed", "split"))  # in full, a string would count as a test
    assert not _has_test_file(split, files)  # test_split_kv is split_kv's
