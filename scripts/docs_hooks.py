"""Build-time helpers for the docs site (``mkdocs.yml`` names this file twice).

* A mkdocs hook: the settings reference (``docs/settings.md``) gets its table from the one
  declaration in ``fa4cache/settings.py`` at every build, and the CLI reference
  (``docs/cli.md``) its per-command flags from the CLI's argparse parser; the current benchmark
  tables and logs in ``benchmarks/results/`` and ``CHANGELOG.md`` become pages of the site, so
  that links to them are checked by ``mkdocs build --strict`` like any other. Only that folder:
  ``benchmarks/archive/`` (superseded numbers, not maintained) stays out of the site.
* A griffe extension for mkdocstrings: ``adapters/`` and ``ray_integration/`` install as
  ``fa4cache.adapters`` and ``fa4cache.ray_integration`` (``pyproject.toml``'s package-dir),
  which griffe cannot find by walking ``fa4cache/``; the extension loads them there, so the
  API reference can name the public face (``fa4cache.install``) wherever it is defined.

Nothing here reaches the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_MARKER = "<!-- settings-table: generated from fa4cache/settings.py at build time -->"
# Subpackages that live outside fa4cache/ (pyproject.toml [tool.setuptools.package-dir]).
MAPPED = {"adapters": ROOT / "adapters", "ray_integration": ROOT / "ray_integration"}


CLI_MARKER = "<!-- cli-reference: generated from fa4cache/cli's parser at build time -->"


def cli_page(markdown: str) -> str:
    """``docs/cli.md`` with its marker replaced by the reference of every command's flags."""
    from fa4cache.cli import markdown_reference

    if CLI_MARKER not in markdown:
        raise ValueError(f"docs/cli.md lost its marker line: {CLI_MARKER}")
    return markdown.replace(CLI_MARKER, markdown_reference())


def settings_page(markdown: str) -> str:
    """``docs/settings.md`` with its marker replaced by the settings table."""
    from fa4cache.settings import markdown_table

    if SETTINGS_MARKER not in markdown:
        raise ValueError(f"docs/settings.md lost its marker line: {SETTINGS_MARKER}")
    return markdown.replace(SETTINGS_MARKER, markdown_table())


# ------------------------------------------------------------------ mkdocs hook events


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    extra = [(ROOT / "CHANGELOG.md", "changelog.md")]
    results = sorted((ROOT / "benchmarks" / "results").iterdir())  # not benchmarks/archive/
    extra += [
        (p, f"results/{p.name}") for p in results if p.is_file() and p.suffix in (".md", ".log", ".txt")
    ]
    for path, uri in extra:
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri in ("settings.md", "cli.md"):
        from mkdocs.exceptions import PluginError

        try:
            return settings_page(markdown) if page.file.src_uri == "settings.md" else cli_page(markdown)
        except ValueError as e:
            raise PluginError(str(e)) from e
    if page.file.src_uri == "changelog.md":  # CHANGELOG.md links from the repository root
        return markdown.replace("](docs/", "](")
    return markdown


# ------------------------------------------------------------------ griffe extension

try:
    import griffe
except ImportError:  # the hook alone (no mkdocstrings) still works
    griffe = None

if griffe is not None:

    class MappedPackages(griffe.Extension):
        """Load ``fa4cache.adapters`` and ``fa4cache.ray_integration`` from their folders."""

        def on_package(self, *, pkg: Any, loader: Any, **kwargs: Any) -> None:
            if pkg.name != "fa4cache":
                return
            for name, folder in MAPPED.items():
                if name not in pkg.members:
                    pkg.set_member(name, loader._load_module(name, folder / "__init__.py", parent=pkg))
