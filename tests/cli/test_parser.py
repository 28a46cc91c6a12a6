"""The CLI's parser (fa4cache/cli/__init__.py): every flag has help, the docs' tables and
reference come from it, global flags go anywhere.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from fa4cache.arch import ARCHS
from tests.conftest import ROOT, worker_env
from tests.helpers.cli_stores import OLD, cli, publish_keyed


def _flags_in_table(text: str) -> dict[str, set[str]]:
    """Per command a commands table's rows name (``| `fa4cache CMD ...` |``; a bundle row
    may name several: `` `fa4cache bundle export FILE [--current]` / `import FILE` ``), the
    flags they name."""
    import re

    out: dict[str, set[str]] = {}
    for cell in re.findall(r"^\| (`fa4cache [^|]*)\|", text, re.M):
        group = ""
        for part in cell.split(" / "):
            words = re.findall(r"[\w-]+", part.replace("fa4cache ", ""))
            if words[0] == "bundle":
                group, words = "bundle ", words[1:]
            flags = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", part))
            out.setdefault(group + words[0], set()).update(flags)
    return out


def test_the_cli_tables_name_only_flags_the_parser_has_and_shows() -> None:
    from fa4cache.cli import commands, options

    cmds = commands()
    for path in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        for cmd, flags in _flags_in_table(path.read_text()).items():
            if cmd not in cmds:  # `bundle export/import/show FILE`: the group's row
                continue
            shown = {f for a in options(cmds[cmd]) for f in a.option_strings}
            assert flags <= shown, (
                f"{path.name}: {cmd} documents {sorted(flags - shown)}, not shown by its parser"
            )
    readme = _flags_in_table((ROOT / "README.md").read_text())
    assert "--rebuild" in readme["verify"]
    assert "--verify" in (ROOT / "README.md").read_text().split("fa4cache bundle", 1)[1].split("\n", 1)[0]


def test_the_cli_reference_is_generated_from_the_parser() -> None:
    import importlib.util

    from fa4cache.cli import commands, markdown_reference, options

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.cli_page((ROOT / "docs" / "cli.md").read_text())
    assert markdown_reference() in page
    for name, p in commands().items():
        assert f"### fa4cache {name}\n" in page, name
        section = page.split(f"### fa4cache {name}\n", 1)[1].split("\n### ", 1)[0]
        for a in options(p, common=False):
            assert f"`{', '.join(a.option_strings) or a.metavar or a.dest}" in section, (name, a.dest)
    assert "--all" not in page.split("### fa4cache bundle export\n", 1)[1].split("\n### ", 1)[0]  # hidden
    with pytest.raises(ValueError, match="lost its marker"):
        hooks.cli_page("# CLI\n")


def test_every_flag_has_help_and_arch_lists_its_choices() -> None:
    from fa4cache.aot.spec import MASKS
    from fa4cache.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [
        f"{name} {'/'.join(a.option_strings)}"
        for name, p in sub.choices.items()
        for a in p._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction) and not a.help
    ]
    assert missing == []
    arch = next(a for a in sub.choices["warm"]._actions if "--arch" in a.option_strings)
    assert tuple(arch.choices) == ARCHS
    mask = next(a for a in sub.choices["warm"]._actions if "--mask" in a.option_strings)
    assert tuple(mask.choices) == MASKS and all(m in mask.help for m in MASKS)
    for name in ("prune", "clear"):
        assert any("--dry-run" in a.option_strings for a in sub.choices[name]._actions)


def test_version_and_cache_dir_after_the_subcommand(tmp_path: Path) -> None:
    from fa4cache import __version__

    env = worker_env(tmp_path / "unused")
    p = cli("--version", env=env)
    # fa4cache's version, then the FA4 release and whether fa4cache was verified on it.
    assert p.returncode == 0 and p.stdout.strip().startswith(f"fa4cache {__version__}; flash-attn-4 "), (
        p.stdout
    )
    d = tmp_path / "c"
    publish_keyed(d, OLD, "fwd", 1)
    for args in (["stats", "--cache-dir", str(d), "--json"], ["--cache-dir", str(d), "stats", "--json"]):
        p = cli(*args, env=env)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["cache_dir"] == str(d) and json.loads(p.stdout)["entries"] == 1
    p = cli("bundle", "export", "--cache-dir", str(d), str(tmp_path / "b.fa4b"), env=env)
    assert p.returncode == 0 and "exported 1 entries" in p.stdout, p.stderr
    p = cli("ls", "--cache-dir", "c", env=env, cwd=tmp_path)  # relative: to where the command runs
    assert p.returncode == 0 and "1 entry" in p.stdout, p.stderr
