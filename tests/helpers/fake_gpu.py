"""The fa4cache CLI on a machine that has a GPU, faked at the lowest level (tests only).

``python -m tests.helpers.fake_gpu <fa4cache arguments>``: when (and only when) the command
imports torch, ``torch.cuda``'s device queries answer as one H200 would (compute capability
9.0, 132 SMs). Nothing is imported or patched ahead: a command that never asks torch sees no
GPU, as it would on the real host. Everything above torch (fa4cache.arch, the CLI) is real.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

NAME, CAPABILITY, SMS = "NVIDIA H200", (9, 0), 132


def _fake_cuda(torch: Any) -> None:
    props = types.SimpleNamespace(
        name=NAME, major=CAPABILITY[0], minor=CAPABILITY[1], multi_processor_count=SMS
    )
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: CAPABILITY
    cuda.get_device_properties = lambda device=None: props
    cuda.get_device_name = lambda device=None: NAME


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds ``torch`` as usual; patches ``torch.cuda`` right after torch's own import ran.
    Stays on ``sys.meta_path`` until then: ``importlib.util.find_spec("torch")`` (is it
    installed?) finds without importing."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            sys.meta_path.remove(self)
            run(module)
            _fake_cuda(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def main() -> int:
    assert "torch" not in sys.modules
    sys.meta_path.insert(0, _AfterTorch())
    from fa4cache.cli import main as cli

    return cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
