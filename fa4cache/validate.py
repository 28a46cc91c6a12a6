"""Value checks shared by the public entry points (attention, specs, model configs)."""

from __future__ import annotations

from typing import Any


def positive_number(value: Any) -> bool:
    """A finite number above 0, not a bool (a softcap, say)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
