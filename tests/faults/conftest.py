"""Fault-injection suite: each test records what was injected and what happened; the table is
printed at the end of the run (tests/conftest.py, which the controller of a parallel run
loads too)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Any:
    # Through the test's report: under pytest-xdist the rows reach the controller that
    # prints the table, not only the worker that ran the test.
    def add(fault: str, injected: str, outcome: str) -> None:
        request.node.user_properties.append(("fault_row", (fault, injected, outcome)))

    return add
