"""scripts/install.sh and the checkout it installs: says what it does, and a clone folder
beside a script does not shadow the editable install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_a_clone_folder_next_to_the_script_does_not_shadow_the_editable_install(tmp_path: Path) -> None:
    """python run from the parent of a clone named fa4cache (a train.py next to it): with the
    editable install alone that folder is imported as an empty namespace package."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # This environment's packages and editable install (its .pth files), as pip made them.
    (site / "parent.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    parent = tmp_path / "work"
    parent.mkdir()
    (parent / "fa4cache").symlink_to(ROOT)  # the clone, under the package's name
    code = "import fa4cache, fa4cache.adapters.compile.warm_specs; print(fa4cache.install.__name__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    fixed = subprocess.run([py, str(ROOT / "scripts" / "link_checkout.py")], capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stderr
    p = subprocess.run([py, "-c", code], cwd=parent, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "install", p.stderr
    p = subprocess.run([py, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "install", p.stderr  # from the checkout too


def test_install_script_says_what_it_is_doing(tmp_path: Path) -> None:
    """scripts/install.sh with a stand-in python3 (no downloads): a line per step, before it
    runs, and a failing step's output."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", checkout / "scripts" / "install.sh")
    stub = tmp_path / "bin"
    stub.mkdir()
    # python3 -m venv .venv makes .venv/bin/python: a stand-in that fails where FAIL_ON says.
    fake_python = '#!/bin/sh\ncase "$*" in *"$FAIL_ON"*) echo "pip: no luck" >&2; exit 1;; esac\necho fake\n'
    (stub / "python3").write_text(
        '#!/bin/sh\nmkdir -p .venv/bin\ncat > .venv/bin/python <<"X"\n' + fake_python + "X\n"
        "chmod +x .venv/bin/python\n"
    )
    (stub / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "FAIL_ON": "never"}
    p = subprocess.run(["bash", "scripts/install.sh"], cwd=checkout, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    steps = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    assert len(steps) == 5 and all(" ... done (" in ln for ln in steps), p.stdout
    assert "torch" in steps[2] and "fa4cache" in steps[3]
    p = subprocess.run(
        ["bash", "scripts/install.sh"],
        cwd=checkout,
        env={**env, "FAIL_ON": "torch=="},
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1 and "[3/5] installing torch" in p.stdout and p.stdout.rstrip().endswith("failed")
    assert "pip: no luck" in p.stderr and "install step failed" in p.stderr
