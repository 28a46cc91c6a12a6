"""The README and the docs site: the site builds with ``mkdocs build --strict``, every Python
snippet runs or says what it needs, the links resolve, and the tables that mirror code (the
settings, the CLI's commands, the public API) cannot drift from it.

A snippet whose first line is ``# needs: ...`` (a GPU, a data loader, a Ray cluster) is not
run: it is compiled, and every ``fa4cache.<name>`` it uses must exist. Every other snippet
runs, in a fresh process like a newcomer's (no target arch set, an empty store).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fa4cache
from tests.conftest import ROOT

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
NEEDS = re.compile(r"^# needs: (\S.*)$")
HAVE_MKDOCS = all(
    importlib.util.find_spec(m) is not None for m in ("mkdocs", "material", "mkdocstrings_handlers.python")
)


def python_snippets(path: Path) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == "python"]


def needs(snippet: str) -> str | None:
    m = NEEDS.match(snippet.splitlines()[0]) if snippet.strip() else None
    return m.group(1) if m else None


def fa4cache_names(snippet: str) -> set[str]:
    """Dotted ``fa4cache.a.b`` chains the snippet reads (attribute access only)."""
    names = set()
    for node in ast.walk(ast.parse(snippet)):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id == "fa4cache" and chain:
            names.add(".".join(reversed(chain)))
    return names


def resolve(dotted: str) -> object:
    obj: object = fa4cache
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- snippets


def test_every_python_snippet_in_the_readme_and_the_docs_runs_or_says_what_it_needs(tmp_path: Path) -> None:
    runnable: list[tuple[str, str]] = []
    for path in [ROOT / "README.md", *PAGES]:
        for i, snippet in enumerate(python_snippets(path)):
            where = f"{path.relative_to(ROOT)} python snippet {i + 1}"
            compile(snippet, where, "exec")  # every snippet is valid Python
            if needs(snippet) is None:
                runnable.append((where, snippet))
                continue
            for name in sorted(fa4cache_names(snippet)):
                if name.startswith("adapters.transformers"):
                    pytest.importorskip("transformers")
                try:
                    resolve(name)
                except AttributeError as e:
                    pytest.fail(f"{where} uses fa4cache.{name}, which does not exist: {e}")
    readme_runnable = [w for w, _ in runnable if w.startswith("README.md")]
    assert readme_runnable, "the README's CPU example lost its place among the runnable snippets"
    # One fresh process, each snippet in a namespace of its own (the imports of torch and FA4
    # are paid once); no target arch, an empty store, as on a newcomer's CPU machine.
    driver = (
        "import json, sys, traceback\n"
        "failed = {}\n"
        "for where, code in json.load(open(sys.argv[1])):\n"
        "    try:\n"
        "        exec(compile(code, where, 'exec'), {'__name__': '__main__'})\n"
        "    except BaseException:\n"
        "        failed[where] = traceback.format_exc()\n"
        "print(json.dumps(failed))\n"
    )
    (tmp_path / "snippets.json").write_text(json.dumps(runnable))
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH")}
    env["FA4CACHE_DIR"] = str(tmp_path / "cache")
    p = subprocess.run(
        [sys.executable, "-c", driver, str(tmp_path / "snippets.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    failed = json.loads(p.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{w}:\n{tb}" for w, tb in failed.items())


_FAKE_CUDA_RUN = """
import json, runpy, sys
from torch._subclasses.fake_tensor import FakeTensorMode
import fa4cache
with FakeTensorMode():  # CUDA tensors without a GPU: FA4 compiles, nothing runs
    runpy.run_path(sys.argv[1], run_name="__main__")  # from a file: the DSL reads the mask_mod's source
c = fa4cache.install().counters.values
print("RESULT", json.dumps({k: c.get(k, 0) for k in ("compiles", "disk_hits")}))
"""


@pytest.mark.compile
def test_the_mask_template_example_reaches_fa4_with_its_aux_tensor(tmp_path: Path) -> None:
    """docs/masks.md's ``@mask_template`` example as written, on fake CUDA tensors and a
    cross-compile for sm_90 (no GPU here): FA4 compiles the template's ``mask_mod``, which
    reads the geometry from the aux tensor it is given (without it the compile fails), the
    kernel is stored, and a second process loads it instead of compiling."""
    (snippet,) = [
        s
        for s in python_snippets(DOCS / "masks.md")
        if "@fa4cache.mask_template" in s and "aux_tensors=[" in s
    ]
    example = tmp_path / "example.py"
    example.write_text(snippet)
    env = {**os.environ, "FA4CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    env |= {"FLASH_ATTENTION_ARCH": "sm_90", "CUTE_DSL_ARCH": "sm_90a", "FLASH_ATTENTION_NUM_SMS": "132"}
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-c", _FAKE_CUDA_RUN, str(example)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.split("RESULT ", 1)[1]))
    assert runs == [{"compiles": 1, "disk_hits": 0}, {"compiles": 0, "disk_hits": 1}], runs


def test_snippet_rules_honour_the_needs_marker() -> None:
    assert needs("# needs: GPU, your data loader\nimport fa4cache\n") == "GPU, your data loader"
    assert needs("import fa4cache\n# needs: GPU\n") is None  # only as the first line
    assert fa4cache_names("fa4cache.adapters.transformers.register()\nx.fa4cache.y") == {
        "adapters",
        "adapters.transformers",
        "adapters.transformers.register",
    }


# ---------------------------------------------------------------- links and tables


def test_readme_links_point_at_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if "://" not in link and not link.startswith("#")]
    assert len(local) >= 10, local  # the README points into the docs
    missing = [link for link in local if not (ROOT / link.split("#")[0]).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def _commands_in(text: str) -> set[str]:
    return set(re.findall(r"^\| `fa4cache (\w+)", text, re.M))


def test_the_cli_tables_name_every_command() -> None:
    import argparse

    from fa4cache.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    commands = set(sub.choices)
    for path in (ROOT / "README.md", DOCS / "cli.md"):
        assert _commands_in(path.read_text()) == commands, path


def test_the_settings_page_gets_its_table_from_the_one_declaration() -> None:
    from fa4cache.settings import SETTINGS, markdown_table

    page = (DOCS / "settings.md").read_text()
    built = hooks().settings_page(page)
    assert markdown_table() in built and all(f"`{s.name}`" in built for s in SETTINGS)
    with pytest.raises(ValueError, match="lost its marker"):
        hooks().settings_page("# Settings\n")


# ---------------------------------------------------------------- the site


@pytest.mark.skipif(not HAVE_MKDOCS, reason="mkdocs, mkdocs-material or mkdocstrings[python] not installed "
                    "(they come with the test extra: pip install -e '.[test]')")  # fmt: skip
def test_the_docs_site_builds_strict_offline(tmp_path: Path) -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["font"] is False  # no web fonts fetched
    plugins = {p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]}
    assert not plugins & {"social", "privacy", "material/social", "material/privacy"}
    nav_pages = set(re.findall(r"([\w.-]+\.md)", json.dumps(config["nav"])))
    assert {p.name for p in PAGES} <= nav_pages | {"changelog.md"}, "a page in docs/ that nav does not list"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # Nothing may be fetched: every proxy points at a closed port.
    env.update({k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")})
    site = tmp_path / "site"
    t0 = time.perf_counter()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(f"mkdocs build --strict: {time.perf_counter() - t0:.1f} s")
    assert p.returncode == 0, p.stderr[-5000:]
    # The settings reference holds every declared setting; the API reference every public name.
    from fa4cache.settings import SETTINGS

    settings_html = (site / "settings" / "index.html").read_text()
    assert all(s.name in settings_html for s in SETTINGS)
    api_html = (site / "api" / "index.html").read_text()
    missing = [n for n in fa4cache.__all__ if f'id="fa4cache.{n}"' not in api_html]
    assert not missing, f"public names without an API entry: {missing}"
    # The README's links into the docs land on a page and an anchor that exist.
    for link in re.findall(r"\]\(docs/([^)\s]+)\)", (ROOT / "README.md").read_text()):
        page, _, anchor = link.partition("#")
        html = (site / ("" if page == "index.md" else page[: -len(".md")]) / "index.html").read_text()
        assert not anchor or f'id="{anchor}"' in html, f"README link docs/{link}: no such anchor"
