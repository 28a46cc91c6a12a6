"""A user's own Ray worker setup hook, to check that fa4cache chains it."""

from __future__ import annotations

import os


def mark() -> None:
    os.environ["USER_HOOK_RAN"] = "1"
