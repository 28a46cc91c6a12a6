"""Settings (fa4cache/settings.py): sizes, durations and placeholders parse; a bad value names
its variable; the log level reaches the library and the CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4cache.cache_dir import resolve_path
from fa4cache.errors import ConfigError
from fa4cache.settings import Settings, parse_duration, parse_size
from fa4cache.store.store import Store
from tests.conftest import ROOT, run_cli
from tests.helpers.cli_stores import DAY


def test_sizes_and_ages_with_units_parse() -> None:
    ages = {"30d": 30 * DAY, "12h": 12 * 3600, "90m": 90 * 60, "45s": 45, "2w": 14 * DAY}
    for text, seconds in ages.items():
        assert parse_duration(text, setting="--older-than") == seconds
    sizes = {"2G": 2 << 30, "500M": 500 << 20, "1024K": 1 << 20, "10B": 10, "1GiB": 1 << 30, "3kb": 3 << 10}
    for text, n in sizes.items():
        assert parse_size(text, setting="--max-size", unit_required=True) == n
    # A setting in the environment keeps its plain byte count (FA4CACHE_MAX_SIZE=1000000).
    assert parse_size("1000000", setting="FA4CACHE_MAX_SIZE") == 1000000


def test_log_level_setting_reaches_the_library_and_the_cli(tmp_path: Path) -> None:
    import logging

    from fa4cache.cli import main
    from fa4cache.settings import BY_NAME

    assert "FA4CACHE_LOG_LEVEL" in BY_NAME
    code = (
        "import logging, fa4cache\n"
        "lg = logging.getLogger('fa4cache.store.example')\n"
        "lg.debug('DEBUG-LINE'); lg.info('INFO-LINE'); lg.warning('WARNING-LINE')\n"
        "print('OK')\n"
    )

    def lib(level: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "FA4CACHE_LOG_LEVEL"}
        if level is not None:
            env["FA4CACHE_LOG_LEVEL"] = level
        return subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
        )

    default, info, error, bad = lib(None), lib("info"), lib("ERROR"), lib("loud")
    assert all(p.stdout.strip() == "OK" for p in (default, info, error, bad))
    assert "WARNING-LINE" in default.stderr and "INFO-LINE" not in default.stderr
    assert "INFO-LINE" in info.stderr and "DEBUG-LINE" not in info.stderr
    assert error.stderr == ""
    assert "FA4CACHE_LOG_LEVEL" in bad.stderr and "WARNING-LINE" in bad.stderr  # one warning, nothing changed
    # The CLI: -v and -q, before or after the command, win over the setting.
    d = tmp_path / "c"
    Store.at(d)  # a store to look at: a path named that holds none is an error (exit 2)
    root = logging.getLogger("fa4cache")
    saved = (root.level, root.propagate, list(root.handlers), logging.getLogger().level)
    try:
        for argv, env, want in (
            (["stats"], None, logging.WARNING),
            (["stats"], "debug", logging.DEBUG),
            (["-v", "stats"], "error", logging.INFO),
            (["stats", "-q"], "debug", logging.ERROR),
            (["ls", "--quiet"], None, logging.ERROR),
        ):
            os.environ.pop("FA4CACHE_LOG_LEVEL", None)
            if env:
                os.environ["FA4CACHE_LOG_LEVEL"] = env
            assert main(["--cache-dir", str(d), *argv]) == 0
            assert root.getEffectiveLevel() == want, (argv, env)
    finally:
        os.environ.pop("FA4CACHE_LOG_LEVEL", None)
        root.setLevel(saved[0])
        root.propagate = saved[1]
        root.handlers[:] = saved[2]
        logging.getLogger().setLevel(saved[3])
    p = run_cli(d, "stats", env={"FA4CACHE_LOG_LEVEL": "loud"})
    assert (
        p.returncode == 2 and "FA4CACHE_LOG_LEVEL" in p.stderr and "debug, info, warning, error" in p.stderr
    )
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    section = cli_doc.split("## Logging", 1)[1].split("\n## ", 1)[0]
    assert all(x in section for x in ("FA4CACHE_LOG_LEVEL", "-v", "-q", "stderr")), section


def test_sizes_durations_and_placeholders(tmp_path: Path) -> None:
    assert parse_size("2G") == 2 << 30 and parse_size("500M") == 500 << 20 and parse_size("1.5K") == 1536
    assert parse_duration("30d") == 30 * 86400 and parse_duration("15m") == 900
    with pytest.raises(ConfigError, match="cannot parse size"):
        parse_size("lots")
    p = resolve_path(str(tmp_path / "c-{user}-{hostname}"), setting="FA4CACHE_DIR", node_id="n1")
    assert "{" not in str(p)
    assert resolve_path("/x/{node_id}", setting="s", node_id="../evil").name == ".._evil"
    with pytest.raises(ConfigError, match="unknown placeholder"):
        resolve_path("/x/{rack}", setting="FA4CACHE_DIR")


def test_bad_environment_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FA4CACHE_LOCK_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="FA4CACHE_LOCK_TIMEOUT"):
        Settings.from_env(tmp_path)
    monkeypatch.delenv("FA4CACHE_LOCK_TIMEOUT")
    monkeypatch.setenv("FA4CACHE_DIR", "relative/path")
    with pytest.raises(ConfigError, match="FA4CACHE_DIR: cache directory must be an absolute path"):
        Settings.from_env()
    monkeypatch.setenv("FA4CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FA4CACHE_MAX_SIZE", "2X")
    with pytest.raises(ConfigError, match="FA4CACHE_MAX_SIZE"):
        Settings.from_env()
