"""The store directory (fa4cache/cache_dir.py): a bad path or a path under a file is refused
with the setting and the fix, by the library and by every command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, worker_env
from tests.helpers.cli_stores import cli


def test_bad_paths_name_the_argument_and_how_base_dirs_splits() -> None:
    import fa4cache
    from fa4cache.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"^cache_dir: expected a directory path \(str or os.PathLike\), got int 123$"
    ):
        fa4cache.Settings.from_env(123)  # what install(123) hands on
    with pytest.raises(ConfigError, match="cache_dir: expected a directory path"):
        fa4cache.install(123)
    for call in (
        lambda: fa4cache.Settings.from_env("/tmp/x", base_dirs="/a:b"),
        lambda: fa4cache.env("/tmp/x", base_dirs="/a:b"),
    ):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith("base_dirs: base store must be an absolute path, got 'b'"), msg
        assert "split at ':'" in msg and "'/a' and 'b'" in msg and "cache directory" not in msg, msg


@pytest.mark.parametrize("written", ["{node_id}", "fa4cache-{user}", "{hostname}/store"])
def test_env_refuses_a_per_node_path_under_a_file_as_install_does(tmp_path: Path, written: str) -> None:
    import fa4cache
    from fa4cache.errors import ConfigError

    afile = tmp_path / "afile"
    afile.write_text("")
    raw = f"{afile}/{written}"
    # install() in a plain process: the path resolved here is under a file.
    with pytest.raises(ConfigError, match=f"cache_dir=.* is under {afile}, which is a file"):
        fa4cache.install(raw)
    # env(): the same check, in the driver, naming the workers' FA4CACHE_DIR and the fix.
    with pytest.raises(ConfigError) as e:
        fa4cache.env(raw)
    msg = str(e.value)
    assert f"is under {afile}, which is a file" in msg and f"FA4CACHE_DIR={raw}" in msg, msg
    assert "point cache_dir at a directory you own" in msg, msg
    # A per-node path that nothing blocks is still accepted, placeholders kept for the workers.
    ok = str(tmp_path / f"ok/{written}")
    assert fa4cache.env(ok)["env_vars"]["FA4CACHE_DIR"] == ok


@pytest.mark.parametrize("command", [["stats"], ["ls"], ["verify"], ["prune", "--older-than", "1d"]])
def test_store_directory_errors_name_the_variable_and_the_fix(tmp_path: Path, command: list[str]) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    p = cli(*command, env=worker_env(f))
    assert p.returncode == 2 and "Errno" not in p.stderr
    assert f"FA4CACHE_DIR={f} is a file, not a directory" in p.stderr and "point FA4CACHE_DIR at" in p.stderr
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    p = cli(*command, env=worker_env(tmp_path / "link"))
    assert p.returncode == 2 and f"name {real} itself" in p.stderr and "FA4CACHE_DIR" in p.stderr


def test_library_store_directory_errors_name_the_variable(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    code = (
        "import sys, fa4cache\n"
        "for call in (fa4cache.stats, fa4cache.install, fa4cache.env):\n"
        "    try:\n"
        "        call()\n"
        "    except fa4cache.ConfigError as e:\n"
        "        print(call.__name__, e)\n"
        "    else:\n"
        "        print(call.__name__, 'no error')\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=worker_env(f), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert set(lines) == {"stats", "install", "env"}
    for name, msg in lines.items():
        assert f"FA4CACHE_DIR={f} is a file, not a directory" in msg, (name, msg)
        assert "point FA4CACHE_DIR at" in msg
