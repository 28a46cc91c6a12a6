"""fa4cache.dict_versions: a dict's version tag moves at every change, by every path, on the
interpreters it is used on; elsewhere it is not used."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from fa4cache import dict_versions, patched_code

VERIFIED = sys.implementation.name == "cpython" and sys.version_info[:2] in dict_versions.VERIFIED


@pytest.fixture
def fresh() -> Iterator[None]:
    saved = dict_versions._reader, dict_versions._decided
    dict_versions._reader, dict_versions._decided = None, False
    try:
        yield
    finally:
        dict_versions._reader, dict_versions._decided = saved


def _tag(d: dict[Any, Any]) -> int:
    read = dict_versions.reader()
    assert read is not None
    return read(dict_versions.addresses([d]))[0]


@pytest.mark.skipif(not VERIFIED, reason="the tags are used on CPython 3.11-3.13 only")
def test_the_tags_are_used_here() -> None:
    # CI's interpreter is one of the verified ones: a reader that silently went missing would
    # send every first key back to the slower comparison.
    assert dict_versions.reader() is not None


def _store_global(value: object) -> None:
    global _GLOBAL_TARGET
    _GLOBAL_TARGET = value


_GLOBAL_TARGET: object = None


@pytest.mark.skipif(not VERIFIED, reason="the tags are used on CPython 3.11-3.13 only")
def test_every_way_of_changing_a_namespace_moves_its_tag() -> None:
    # The interpreter's own fast paths included: a store it has specialised after many runs
    # of the same instruction (module attributes, globals, class attributes).
    module = types.ModuleType("_fa4cache_probe_tags")

    class Holder:
        pass

    mod_dict, class_dict = vars(module), dict_versions.namespace(Holder)
    assert class_dict is not None and dict_versions.namespace(module) is mod_dict
    globals_dict = globals()
    for i in range(200):  # (enough runs for the specialising interpreter to specialise)
        new = object()  # (storing the object a name already holds is no change)
        before = _tag(mod_dict)
        module.x = new
        assert _tag(mod_dict) != before, ("module attribute", i)
        before = _tag(class_dict)
        Holder.x = new
        assert _tag(class_dict) != before, ("class attribute", i)
        before = _tag(globals_dict)
        _store_global(new)
        assert _tag(globals_dict) != before, ("global", i)
    # A change undone is still a change: the tag never goes back.
    before = _tag(mod_dict)
    module.y = 1
    del module.y
    assert _tag(mod_dict) != before


def test_an_interpreter_it_was_not_checked_on_compares_contents(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dict_versions, "VERIFIED", ())
    assert dict_versions.reader() is None
    name = "flash_attn.cute._fa4cache_probe_untagged"
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    try:
        patched_code.forget()
        patched_code.runtime_patches(snapshot=True)
        assert patched_code._snapshot is not None and patched_code._snapshot.tags is None
        mod.fix = lambda: None  # the user's code: found by the comparison of contents
        assert any(f.startswith(f"{name}.fix ") for f in patched_code.runtime_patches())
    finally:
        del sys.modules[name]
        patched_code.forget()


def test_a_layout_it_does_not_expect_is_not_read(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the length is not where the layout puts it, the tag beside it is not trusted.
    monkeypatch.setattr(dict_versions, "_USED_AT", 8)
    assert dict_versions.reader() is None
