"""Which optional dependency (``pip install fa4cache[...]``) a feature needs, said once.

``import fa4cache`` and the CLI need only ``filelock``; kernels need the ``[fa4]`` extra
(torch, flash-attn-4, the CuTe DSL). A feature calls :func:`require` before its first
heavy import, so a missing package is an error naming the extra to install instead of a
bare ``No module named 'torch'``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from fa4cache.errors import FA4NotAvailable

# Top-level module -> (distribution, extra that installs it).
PROVIDED_BY = {
    "torch": ("torch", "fa4"),
    "flash_attn": ("flash-attn-4", "fa4"),
    "cutlass": ("nvidia-cutlass-dsl", "fa4"),
    "triton": ("triton", "fa4"),
    "transformers": ("transformers", "transformers"),
    "ray": ("ray", "ray"),
}


def missing(*modules: str) -> list[str]:
    """The top-level ``modules`` that cannot be imported here (without importing them)."""
    out = []
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(m)
    return out


def pip_line(*modules: str) -> str:
    """The ``pip install 'fa4cache[...]'`` line that installs ``modules`` (top-level module
    names or distribution names, as :data:`PROVIDED_BY` lists them)."""
    by_dist = {dist: extra for dist, extra in PROVIDED_BY.values()}
    extras = sorted({PROVIDED_BY[m][1] if m in PROVIDED_BY else by_dist.get(m, "fa4") for m in modules})
    return f"pip install 'fa4cache[{','.join(extras)}]'"


def require(feature: str, *modules: str) -> None:
    """:class:`FA4NotAvailable` naming the ``pip install`` line when one of ``modules`` is missing."""
    absent = missing(*modules)
    if not absent:
        return
    dists = ", ".join(PROVIDED_BY.get(m, (m, ""))[0] for m in absent)
    raise FA4NotAvailable(
        f"{feature} needs {dists}, which {'is' if len(absent) == 1 else 'are'} not installed: "
        f"{pip_line(*absent)}"
    )


def triton_runs_on(t: Any) -> bool:
    """Whether fa4cache's Triton kernels run on ``t``: a CUDA tensor with values (not a fake
    one, as a mask built under ``FakeTensorMode`` to cross-compile is), Triton installed, and
    ``FA4CACHE_TRITON`` not ``0``."""
    from fa4cache.settings import setting

    if not t.is_cuda or not setting("FA4CACHE_TRITON"):
        return False
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(t):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
