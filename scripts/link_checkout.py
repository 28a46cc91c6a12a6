"""Make this checkout's editable install win over a folder named like the package.

``pip install -e .`` of this project (``adapters/`` is mapped to ``fa4cache.adapters`` in
pyproject.toml) installs an import hook that Python asks *after* its search of
``sys.path``. Run Python from the parent of a clone named ``fa4cache`` (a ``train.py`` next
to the clone) and that search finds the clone folder first: a directory without
``__init__.py``, which Python imports as an empty namespace package, so
``fa4cache.install`` is an ``AttributeError``. A regular package found anywhere on
``sys.path`` beats a namespace folder, so this script puts one there: a directory in the
environment's site-packages holding only a link to this checkout's ``fa4cache/`` package,
named by a ``.pth`` file. The mapped subpackages still come from the editable hook, and
new modules are picked up as before (the link is to the directory).

Run it with the environment's Python after ``pip install -e .`` (``scripts/install.sh``
does); it is idempotent. ``pip uninstall fa4cache`` leaves the two files it made, which are
harmless without the install and removed with the environment.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

NAME = "fa4cache-checkout"  # a hyphen: never importable itself


def link(root: Path, site: Path) -> Path:
    """Link ``root/fa4cache`` from ``site/NAME/`` and name that directory in ``site/NAME.pth``."""
    holder = site / NAME
    holder.mkdir(exist_ok=True)
    target = holder / "fa4cache"
    if target.is_symlink() or target.exists():
        target.unlink()
    target.symlink_to(root / "fa4cache", target_is_directory=True)
    pth = site / f"{NAME}.pth"
    pth.write_text(f"{holder}\n")
    return pth


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    if not (root / "fa4cache" / "__init__.py").is_file():
        print(f"link_checkout: {root} is not an fa4cache checkout", file=sys.stderr)
        return 2
    pth = link(root, Path(sysconfig.get_paths()["purelib"]))
    print(f"linked {root / 'fa4cache'} from {pth}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
