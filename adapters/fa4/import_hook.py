"""Run a callback on the modules of a package right after each is imported.

FA4's and QuACK's compile caches are patched this way, so that ``install()`` never has to
import them itself (FA4's import takes about 10 s on a GPU host).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any


class PostImportHook(importlib.abc.MetaPathFinder):
    """Calls ``on_import(module)`` after each module named ``<package>.*`` (but ``skip``) runs.

    ``install()`` puts it first on ``sys.meta_path``; ``remove()`` takes it off.
    """

    def __init__(
        self, package: str, on_import: Callable[[types.ModuleType], None], *, skip: tuple[str, ...] = ()
    ) -> None:
        self.prefix = package + "."
        self.on_import = on_import
        self.skip = skip

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.prefix) or fullname in self.skip:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _LoaderProxy(loader, self.on_import)  # per spec: the shared loader is untouched
        return spec


class _LoaderProxy(importlib.abc.Loader):
    def __init__(self, loader: Any, after: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
