"""fa4cache.patched_code: which functions of the code generators' modules were replaced at run time.

A module of the checked packages is put into ``sys.modules`` here (FA4 itself is not imported:
``tests/test_identity_kernels.py`` patches the real one and compiles). Its functions
come from a library file, from fa4cache's own files, or from this test file (a patch).
"""

from __future__ import annotations

import functools
import os.path
import sys
import types
from collections.abc import Iterator

import pytest

from fa4cache import patched_code

NAME = "flash_attn.cute._fa4cache_probe"


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType(NAME)
    mod.join = os.path.join  # imported from the standard library: not a patch
    mod.forget = patched_code.forget  # fa4cache's own code: allowed

    class Kernel:
        pass

    Kernel.__module__ = NAME
    mod.Kernel = Kernel
    sys.modules[NAME] = mod
    try:
        yield mod
    finally:
        del sys.modules[NAME]
        patched_code.forget()


def _hot_fix(x: int) -> int:
    return x + 1


def _found() -> list[str]:
    return [f for f in patched_code.runtime_patches() if f.startswith(NAME)]


def test_library_and_own_functions_are_not_patches(module: types.ModuleType) -> None:
    assert _found() == []


@pytest.mark.parametrize(
    "where",
    ["function", "wrapped", "partial", "method", "staticmethod", "property"],
)
def test_a_function_of_user_code_in_the_module_is_a_patch(module: types.ModuleType, where: str) -> None:
    if where == "function":
        module.call_mask_mod = _hot_fix
        want = f"{NAME}.call_mask_mod"
    elif where == "wrapped":  # cute.jit's wrapper is the DSL's code; what it wraps is the user's
        wrapper = types.FunctionType(os.path.join.__code__, vars(os.path))  # code of a library file
        wrapper.__wrapped__ = _hot_fix  # type: ignore[attr-defined]
        module.call_mask_mod = wrapper
        want = f"{NAME}.call_mask_mod"
    elif where == "partial":
        module.call_mask_mod = functools.partial(_hot_fix, 1)
        want = f"{NAME}.call_mask_mod"
    elif where == "method":
        module.Kernel.apply_mask = _hot_fix
        want = f"{NAME}.Kernel.apply_mask"
    elif where == "staticmethod":
        module.Kernel.apply_mask = staticmethod(_hot_fix)
        want = f"{NAME}.Kernel.apply_mask"
    else:
        module.Kernel.tile = property(_hot_fix)
        want = f"{NAME}.Kernel.tile"
    found = _found()
    assert len(found) == 1 and found[0].startswith(want + " ") and __file__ in found[0], found


def test_a_replacement_that_says_it_only_observes_is_not_a_patch(module: types.ModuleType) -> None:
    def counted(x: int) -> int:
        return _hot_fix(x)

    counted.__fa4cache_codegen_neutral__ = True  # type: ignore[attr-defined]
    module.call_mask_mod = counted
    assert _found() == []


def test_found_once_checks_once_and_forget_checks_again(module: types.ModuleType) -> None:
    patched_code.forget()
    assert not [f for f in patched_code.found_once() if f.startswith(NAME)]
    module.call_mask_mod = _hot_fix
    assert not [f for f in patched_code.found_once() if f.startswith(NAME)]  # memoised: once per process
    patched_code.forget()
    assert [f for f in patched_code.found_once() if f.startswith(NAME)]


@pytest.mark.parametrize("change", ["assigned", "code replaced", "wrapped", "class method"])
def test_a_patch_made_after_a_walk_is_found_by_the_next(module: types.ModuleType, change: str) -> None:
    # The walk judges again only what changed since the last one (the first key's check after
    # the warm-up's): every kind of change must count as one.
    def library_like(x: int) -> int:
        return x

    library_like.__code__ = os.path.join.__code__  # code of a library file: not a patch
    module.call_mask_mod = library_like
    assert _found() == []
    if change == "assigned":
        module.call_mask_mod = _hot_fix
    elif change == "code replaced":
        library_like.__code__ = _hot_fix.__code__
    elif change == "wrapped":
        library_like.__wrapped__ = _hot_fix  # type: ignore[attr-defined]
    else:
        module.Kernel.apply_mask = _hot_fix
    found = _found()
    assert len(found) == 1 and __file__ in found[0], found
    if change == "assigned":  # undone: clean again
        module.call_mask_mod = library_like
        assert _found() == []
