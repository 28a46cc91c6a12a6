"""Fault-injection suite: collects a table of what was injected and what happened."""

from __future__ import annotations

from typing import Any

import pytest

_ROWS: list[tuple[str, str, str]] = []


@pytest.fixture
def record() -> Any:
    def add(fault: str, injected: str, outcome: str) -> None:
        _ROWS.append((fault, injected, outcome))

    return add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _ROWS:
        return
    tr = terminalreporter
    tr.section("fa4cache fault injection: what was injected, what happened")
    tr.write_line("| fault | injected | outcome |")
    tr.write_line("|---|---|---|")
    for row in _ROWS:
        tr.write_line("| " + " | ".join(row) + " |")
