"""A warm run's report: one row per item, and what failed."""

from __future__ import annotations


def test_a_report_has_one_line_per_row_and_names_what_failed() -> None:
    from fa4cache.adapters.compile.report import WarmReport, WarmRow, row_of

    from fa4cache.aot.plan import Target
    from fa4cache.aot.spec import KernelSpec

    a, b = KernelSpec(head_dim=64), KernelSpec(head_dim=128, backward=True)
    ok = row_of(a, {"compiles": 1, "present": 0, "seconds": 2.0, "error": None, "compile_seconds": 1.5})
    bad = WarmRow(b, 2, 1, 3.0, "RuntimeError: boom", 2.5, 5)
    report = WarmReport(Target(), (ok, bad), 3.0)
    assert (ok.kernels, report.compiled, report.present) == (1, 3, 1)
    assert report.failed == ((b.label(), "RuntimeError: boom"),) and not report.ok
    header, *lines = report.table()
    assert header.split()[:3] == ["item", "compiled", "present"] and len(lines) == 2
    assert lines[0].endswith("ok") and "FAILED: RuntimeError: boom" in lines[1]
    assert WarmReport(Target(), (ok,), error="node is not alive").failed == (("*", "node is not alive"),)
