"""Listing a call's kernels (fa4cache.adapters.compile.kernel_set): fa4cache's selector against
FA4's own compile-miss probe (4.0.0b40's ``interface._compile_misses``), with real FA4 on fake
CUDA tensors in a fresh process. Run against 4.0.0b40 with
``bash scripts/test_overlay.sh flash-attn-4==4.0.0b40 -- -q tests/adapters/compile/test_kernel_set.py``.

Why warm's plans keep the selector, even where FA4 has a probe: both answer the same
``key in compile_cache`` question at the same place, so the probe names no kernel the selector
does not; but FA4 asks through the probe (``_needs_compile``) only for its forward-side
kernels. The backward tests ``key in cache`` and ``cache.get(key)`` itself, so under the probe
its kernels compile while being "listed" (the test sees them published by the probe's run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, worker_env


def _probe_here() -> str | None:
    spec = importlib.util.find_spec("flash_attn")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    for r in roots:
        path = os.path.join(r, "cute", "interface.py")
        if os.path.exists(path) and "_compile_misses" in Path(path).read_text():
            return None
    return "the installed FA4 has no compile-miss probe (4.0.0b40 has)"


_why = _probe_here()

_LIST = """
import json, sys
from fa4cache.adapters.patch import install
from fa4cache.adapters.compile import kernel_set
from fa4cache.adapters.fa4 import compile_cache
from fa4cache.aot.spec import KernelSpec
from fa4cache.store import runtime

install(sys.argv[1])
import flash_attn.cute.interface as fi


def by_probe(run):
    # FA4's probe records (id(cache), key) for each key its cache says it lacks.
    misses = set()
    token = fi._compile_misses.set(misses)
    try:
        run()
    finally:
        fi._compile_misses.reset(token)
    caches = {id(c): c for c in (getattr(getattr(fi, n), "compile_cache", None) for n in dir(fi))
              if isinstance(c, compile_cache.StoreCompileCache)}
    return sorted([caches[i].kind, caches[i].ref(k).digest] for i, k in misses)


out = []
for spec in json.loads(sys.argv[2]):
    job = kernel_set.SpecJob(spec)
    selector = sorted([k.kind, k.digest] for k in kernel_set.plan(job.run))
    before = {e.ref.digest for e in runtime.installed_store().entries()}
    probe = by_probe(job.run)
    # What the probe's run compiled (and published) instead of listing it.
    compiled = sorted([e.ref.kind, e.ref.digest] for e in runtime.installed_store().entries()
                      if e.ref.digest not in before)
    out.append({"label": KernelSpec.from_dict(spec).label(), "selector": selector, "probe": probe,
                "compiled": compiled})
print("RESULT " + json.dumps(out))
"""


def _listed(cache: Path, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    p = subprocess.run(
        [sys.executable, "-c", _LIST, str(cache), json.dumps(specs)],
        cwd=ROOT, env=worker_env(cache, FA4CACHE_COMPILE_AHEAD="0"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.skipif(_why is not None, reason=_why or "")
@pytest.mark.compile
def test_fa4s_probe_lists_the_forward_kernels_the_selector_lists_and_cannot_list_the_backward(
    tmp_path: Path,
) -> None:
    from fa4cache.aot.spec import KernelSpec

    forward = [
        KernelSpec(mask="causal", head_dim=64, seqlen=256, backward=False),
        KernelSpec(mask="document", head_dim=128, seqlen=512, varlen=True, backward=False),
        KernelSpec(mask="causal", head_dim=128, heads=8, heads_kv=2, seqlen=384, backward=False),
    ]
    backward = KernelSpec(mask="causal", head_dim=64, seqlen=256, backward=True)
    rows = _listed(tmp_path / "cache", [s.to_dict() for s in [*forward, backward]])
    for row in rows[:3]:  # the same kernel keys, and nothing compiled by either
        assert row["probe"] == row["selector"] and row["compiled"] == [], row
        assert [k for k, _ in row["selector"]] == ["fwd"], row
    bwd = rows[3]
    kinds = {k for k, _ in bwd["selector"]}
    assert {"fwd", "bwd_preprocess", "bwd", "bwd_postprocess_convert"} <= kinds, bwd
    # Under FA4's probe the forward is listed and the backward's kernels are compiled: the
    # selector's kernels, split between the two.
    assert [k for k, _ in bwd["probe"]] == ["fwd"], bwd
    assert sorted(bwd["probe"] + bwd["compiled"]) == bwd["selector"], bwd
