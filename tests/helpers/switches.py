"""Set a decode switch for one test: ``fa4cache.settings.decode_switches`` reads them once a
process, so the environment is changed and the switches read again, both undone with the
test's monkeypatch."""

from __future__ import annotations

import pytest

from fa4cache import settings


def set_switch(monkeypatch: pytest.MonkeyPatch, name: str, value: str | None) -> None:
    """``name`` (one of :data:`fa4cache.settings.DECODE_SWITCHES`) set to ``value`` (None: unset)."""
    assert name in settings.DECODE_SWITCHES, name
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(settings, "_decode_switches", [settings.DecodeSwitches.from_env()])
