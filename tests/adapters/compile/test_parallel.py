"""The warm runner's parallel workers (adapters/compile/parallel.py): a kernel compiled but
not stored is a failed item.
"""

from __future__ import annotations


def test_parallel_warm_reports_a_kernel_compiled_but_not_stored_as_failed() -> None:
    from fa4cache.adapters.compile.parallel import merge

    from fa4cache.aot.spec import KernelSpec

    specs = [KernelSpec(mask="document"), KernelSpec(mask="causal")]
    results = [{"jobs": [["a", "b"], ["c"]], "compiled": {"a": 1.0, "c": 2.0}, "errors": {}}]
    ok, lost = merge(specs, results, 3.0, stored={"a", "b"})
    assert ok["error"] is None and ok["compiles"] == 1 and ok["present"] == 1
    assert lost["compiles"] == 1 and "not saved" in lost["error"]
