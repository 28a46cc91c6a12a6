"""The package face (fa4cache/__init__.py): the names it lists and how it resolves the adapters."""

from __future__ import annotations

import pytest

import fa4cache


def test_package_face_lists_no_typing_helpers_and_resolves_adapters() -> None:
    names = dir(fa4cache)
    assert not {"Any", "TYPE_CHECKING", "annotations"} & set(names)
    assert {"adapters", "install", "make_document_mask", "attention", "__version__"} <= set(names)
    assert fa4cache.adapters.compile.warm_specs.__name__ == "fa4cache.adapters.compile.warm_specs"
    assert "transformers" in dir(fa4cache.adapters)
    with pytest.raises(AttributeError, match="nope"):
        fa4cache.adapters.nope  # noqa: B018
