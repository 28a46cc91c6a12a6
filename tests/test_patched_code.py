"""fa4cache.patched_code: which functions of the code generators' modules were replaced at run time.

A module of the checked packages is put into ``sys.modules`` here (FA4 itself is not imported:
``tests/test_identity_kernels.py`` patches the real one and compiles). Its functions
come from a library file, from fa4cache's own files, or from this test file (a patch).
"""

from __future__ import annotations

import array
import dataclasses
import functools
import gc
import os.path
import sys
import threading
import types
from collections.abc import Iterator
from unittest import mock

import pytest

from fa4cache import dict_versions, patched_code

NAME = "flash_attn.cute._fa4cache_probe"
_ABSENT = object()


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    # A warm-up walk that an earlier test's FA4 import started in this worker would take its
    # own snapshot midway through a test here: let it finish first.
    for t in threading.enumerate():
        if t.name == "fa4cache-patch-check":
            t.join(60)
    # and none starts during the test (an FA4 import another test's thread makes meanwhile)
    warming, patched_code._warming = patched_code._warming, True
    # and garbage of earlier tests (an in-process compile's) is collected now, not between a
    # test's snapshot and its check, where a finalizer that writes a module's global would
    # count as a change
    gc.collect()
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
        patched_code._warming = warming
        patched_code.forget()


def _hot_fix(x: int) -> int:
    return x + 1


def _found() -> list[str]:
    return [f for f in patched_code.runtime_patches() if f.startswith(NAME)]


def test_library_and_own_functions_are_not_patches(module: types.ModuleType) -> None:
    assert _found() == []


class _SaysNeutral(dict):  # a function's __dict__ that answers get() as a neutral mark would
    def get(self, key: object, default: object = None) -> object:
        return True if key == patched_code.NEUTRAL else super().get(key, default)


class _LooksEmpty(dict):  # a function's __dict__ that holds __wrapped__ but says it is empty
    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False


class _Descriptor:  # what a class attribute access runs: the user's __get__
    def __get__(self, obj: object, owner: object = None) -> object:
        return _hot_fix


class _Fixer:  # a callable instance whose __call__ is the user's code
    def __call__(self, x: int) -> int:
        return x + 1

    def fix(self, x: int) -> int:
        return x + 1


def _library_code_wrapping(target: object) -> types.FunctionType:
    wrapper = types.FunctionType(os.path.join.__code__, vars(os.path))  # code of a library file
    wrapper.__wrapped__ = target  # type: ignore[attr-defined]
    return wrapper


WHERE = [
    "function", "wrapped", "partial", "method", "staticmethod", "property", "lru_cache", "bound method",
    "partialmethod", "cached_property", "callable instance", "class", "__dict__ says neutral",
    "__dict__ looks empty", "partial's argument", "mock", "descriptor", "nested class",
    "class of a module not imported",
]  # fmt: skip


@pytest.mark.parametrize("where", WHERE)
def test_a_function_of_user_code_in_the_module_is_a_patch(module: types.ModuleType, where: str) -> None:
    want = f"{NAME}.call_mask_mod"
    if where == "function":
        module.call_mask_mod = _hot_fix
        want = f"{NAME}.call_mask_mod"
    elif where == "wrapped":  # cute.jit's wrapper is the DSL's code; what it wraps is the user's
        module.call_mask_mod = _library_code_wrapping(_hot_fix)
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
    elif where == "property":
        module.Kernel.tile = property(_hot_fix)
        want = f"{NAME}.Kernel.tile"
    elif where == "lru_cache":  # a hot-fix made cheap the natural way
        module.call_mask_mod = functools.lru_cache(maxsize=None)(_hot_fix)
    elif where == "bound method":
        module.call_mask_mod = _Fixer().fix
    elif where == "partialmethod":
        module.Kernel.apply_mask = functools.partialmethod(_hot_fix)
        want = f"{NAME}.Kernel.apply_mask"
    elif where == "cached_property":
        module.Kernel.tile = functools.cached_property(_hot_fix)
        want = f"{NAME}.Kernel.tile"
    elif where == "callable instance":
        module.call_mask_mod = _Fixer()
    elif where == "class":  # a class of the user's put in the module's place
        module.Kernel = _Fixer
        want = f"{NAME}.Kernel"
    elif where == "__dict__ says neutral":
        fix = types.FunctionType(_hot_fix.__code__, globals())
        fix.__dict__ = _SaysNeutral()
        module.call_mask_mod = fix
    elif where == "__dict__ looks empty":
        wrapper = _library_code_wrapping(_hot_fix)
        wrapper.__dict__ = _LooksEmpty(__wrapped__=_hot_fix)
        module.call_mask_mod = wrapper
    elif where == "partial's argument":  # a library function handed the user's
        module.call_mask_mod = functools.partial(map, _hot_fix)
    elif where == "mock":  # unittest.mock.patch's object runs whatever it was given
        from unittest import mock

        module.call_mask_mod = mock.MagicMock(side_effect=len)
        where_from = "unittest.mock"
    elif where == "descriptor":
        module.Kernel.tile = _Descriptor()
        want = f"{NAME}.Kernel.tile"
    elif where == "nested class":

        class Params:
            pass

        Params.__module__, Params.__qualname__ = NAME, f"{module.Kernel.__qualname__}.Params"
        module.Kernel.Params = Params
        Params.create = _hot_fix
        want = f"{NAME}.Kernel.Params.create"
    else:

        class Orphan:
            pass

        Orphan.__module__ = "_fa4cache_never_imported"
        module.Kernel = Orphan
        want = f"{NAME}.Kernel"
        where_from = "a class of '_fa4cache_never_imported'"
    found = _found()
    if where not in ("mock", "class of a module not imported"):
        where_from = f"a class of {__name__!r}" if where == "class" else __file__
    assert len(found) == 1 and found[0].startswith(want + " ") and where_from in found[0], found


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


def test_the_check_off_trusts_the_files_for_loads_never_for_a_publish(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    module.call_mask_mod = _hot_fix
    walks: list[bool] = []
    real = patched_code.runtime_patches
    monkeypatch.setattr(patched_code, "runtime_patches", lambda **kw: walks.append(True) or real(**kw))
    monkeypatch.setenv("FA4CACHE_PATCH_CHECK", "0")
    patched_code.forget()
    assert patched_code.found_for_loads() == () and walks == []  # the first key waits for no walk
    assert [f for f in patched_code.found_once() if f.startswith(NAME)] and walks == [True]  # a publish
    assert [f for f in patched_code.found_for_loads() if f.startswith(NAME)]  # and loads stop from then on
    monkeypatch.setenv("FA4CACHE_PATCH_CHECK", "1")
    assert [f for f in patched_code.found_for_loads() if f.startswith(NAME)]


CHANGES = [
    "assigned", "code replaced", "wrapped", "class method", "staticmethod re-initialised",
    "property re-initialised", "partial's state set", "a class becomes the module's", "text code's module",
    "__dict__ replaced by one that looks empty", "lru_cache's __wrapped__", "callable instance's class",
    "an instance's class gains __call__", "an instance's class gains a base", "a held module's class",
    "a class's __module__ set where it is only held", "a name deleted and set again",
    "a checked module's class", "a defined class's bases", "an immutable class's __module__, through gc",
    "a callable instance's class gains __get__", "a flag becomes a mock", "a base's __module__",
]  # fmt: skip


class _CallableModule(types.ModuleType):  # what a held submodule's __class__ can become
    __call__ = _hot_fix


class _UsersModule(types.ModuleType):  # what a checked module's __class__ can become
    def __getattribute__(self, name: str) -> object:
        return _hot_fix if name == "call_mask_mod" else super().__getattribute__(name)


class _UsersBase:  # what a defined class's bases can become: its methods come with it
    def apply_mask(self) -> None: ...


@pytest.mark.parametrize("way", ["by version tags", "by contents"])
@pytest.mark.parametrize("change", CHANGES)
def test_a_patch_made_after_a_walk_is_found_by_the_next(
    module: types.ModuleType, change: str, way: str
) -> None:
    # The walk judges again only what changed since the last one (the first key's check after
    # the warm-up's): every kind of change must count as one, objects changed in place included,
    # whether the snapshot reads the namespaces' version tags (where this interpreter's can be
    # trusted: CI's can) or compares what they hold.
    def library_like(x: int) -> int:
        return x

    library_like.__code__ = os.path.join.__code__  # code of a library file: not a patch
    module.call_mask_mod = library_like
    module.Kernel.sm = staticmethod(os.path.join)
    module.Kernel.tile = property(os.path.join)
    module.bound = functools.partial(os.path.join, "a")

    class Foreign:  # held by the module but not defined there (as of a library's module)
        def meth(self) -> None: ...

    Foreign.__module__ = "os.path"
    module.Foreign = Foreign
    module.cached = functools.lru_cache(maxsize=None)(os.path.join)

    class Caller:
        __call__ = os.path.join  # a library's function as __call__

    Caller.__module__ = "os.path"
    module.caller = Caller()

    class Start:
        pass

    class Base:
        pass

    class Plain(Start):  # its instances run no code, until the class changes
        pass

    Plain.__module__ = "os.path"
    module.plain = Plain()
    text = types.FunctionType(compile("def g(): pass", "<string>", "exec").co_consts[0], {}, "g")
    text.__module__ = NAME  # code generated as text in the package's own namespace: allowed
    module.generated = text
    module.sub = types.ModuleType(NAME + ".sub")  # a submodule, as its package holds it

    class Elsewhere:  # held by the module, defined in a library's module
        pass

    Elsewhere.__module__ = "os.path"
    module.Elsewhere = Elsewhere
    module.array = array.array  # a class no Python code can change (an immutable type)

    class LibraryBase:
        pass

    class Defined(LibraryBase):  # a class the module defines, on a library's base
        pass

    LibraryBase.__module__ = "os.path"
    Defined.__module__ = NAME
    module.Defined = Defined
    module.FLAG = False
    assert [f for f in patched_code.runtime_patches(snapshot=True) if f.startswith(NAME)] == []
    snap = patched_code._snapshot
    assert snap is not None  # the next call is answered by the snapshot's passes
    if way == "by version tags":
        assert (snap.tags is not None) == (dict_versions.reader() is not None)
    else:
        patched_code._snapshot = dataclasses.replace(snap, tags=None)
    if change == "assigned":
        module.call_mask_mod = _hot_fix
    elif change == "code replaced":
        library_like.__code__ = _hot_fix.__code__
    elif change == "wrapped":
        library_like.__wrapped__ = _hot_fix  # type: ignore[attr-defined]
    elif change == "class method":
        module.Kernel.apply_mask = _hot_fix
    elif change == "staticmethod re-initialised":
        module.Kernel.__dict__["sm"].__init__(_hot_fix)
    elif change == "property re-initialised":
        module.Kernel.__dict__["tile"].__init__(_hot_fix)
    elif change == "partial's state set":
        module.bound.__setstate__((_hot_fix, ("a",), {}, None))
    elif change == "a class becomes the module's":
        Foreign.__module__ = NAME
    elif change == "__dict__ replaced by one that looks empty":
        library_like.__dict__ = _LooksEmpty(__wrapped__=_hot_fix)
    elif change == "lru_cache's __wrapped__":
        module.cached.__wrapped__ = _hot_fix
    elif change == "callable instance's class":
        module.caller.__class__ = _Fixer
    elif change == "an instance's class gains __call__":
        Plain.__call__ = _hot_fix
    elif change == "an instance's class gains a base":
        Base.__call__ = _hot_fix
        Plain.__bases__ = (Base,)
    elif change == "a held module's class":
        module.sub.__class__ = _CallableModule
    elif change == "a class's __module__ set where it is only held":
        Elsewhere.__module__ = "_fa4cache_users_code"  # (a class of the user's: no module vouches for it)
    elif change == "a checked module's class":
        module.__class__ = _UsersModule
    elif change == "a defined class's bases":
        module.Defined.__bases__ = (_UsersBase,)
    elif change == "an immutable class's __module__, through gc":
        held = gc.get_referents(vars(array.array))[0]
        saved = held.get("__module__", _ABSENT)
        held["__module__"] = "_fa4cache_users_code"
    elif change == "a callable instance's class gains __get__":
        Caller.__get__ = _hot_fix  # type: ignore[attr-defined]
    elif change == "a flag becomes a mock":
        module.FLAG = mock.NonCallableMagicMock()
    elif change == "a base's __module__":
        LibraryBase.__module__ = "_fa4cache_users_code"
    elif change == "a name deleted and set again":
        del module.call_mask_mod  # the same names, in another order: the fix comes last
        module.call_mask_mod = _hot_fix
    else:
        text.__module__ = "__main__"  # text code outside the package: a patch
    try:
        found = _found()
    finally:
        if change == "a checked module's class":
            module.__class__ = types.ModuleType
        elif change == "an immutable class's __module__, through gc":
            if saved is _ABSENT:
                del held["__module__"]
            else:
                held["__module__"] = saved
    where = {
        "text code's module": "(<string>)",
        "a class's __module__ set where it is only held": "'_fa4cache_users_code'",
        "an immutable class's __module__, through gc": "'_fa4cache_users_code'",
        "a checked module's class": "_UsersModule",
        "a defined class's bases": "_UsersBase",
        "a flag becomes a mock": "unittest.mock",
        "a base's __module__": "LibraryBase of '_fa4cache_users_code'",
    }.get(change, __file__)
    assert len(found) == 1 and where in found[0], found
    if change == "assigned":  # undone: clean again
        module.call_mask_mod = library_like
        assert _found() == []


def test_a_module_under_two_names_is_judged_under_each(module: types.ModuleType) -> None:
    # cutlass.cuda is cutlass.base_dsl.runtime.cuda: its classes are its own under one name only.
    alias = NAME + "_alias"
    sys.modules[alias] = module
    try:
        assert _found() == []
        module.Kernel.apply_mask = _hot_fix
        assert _found() == [f for f in _found() if ".Kernel.apply_mask " in f] != []
    finally:
        del sys.modules[alias]


def test_a_patch_landing_while_a_walk_judges_is_found_by_the_next(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another thread patches between the walk's reading of a function and its record: the
    # record must not vouch for the patched state.
    lib = types.FunctionType(os.path.join.__code__, vars(os.path), "lib")
    module.lib = lib
    real = patched_code._foreign

    def judging(fn: types.FunctionType, own: tuple[str, ...]) -> bool:
        verdict = real(fn, own)
        if fn is lib:
            lib.__code__ = _hot_fix.__code__  # lands right after lib was judged
            monkeypatch.setattr(patched_code, "_foreign", real)
        return verdict

    monkeypatch.setattr(patched_code, "_foreign", judging)
    _found()  # the walk during which the patch lands
    found = _found()
    assert len(found) == 1 and found[0].startswith(f"{NAME}.lib "), found


def test_a_child_forked_during_the_warm_up_checks_for_itself(module: types.ModuleType) -> None:
    # The warm-up thread holds the walk's lock; a child forked meanwhile (a fork-started data
    # loader) must not wait for a thread it does not have.
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    import time

    slow = types.ModuleType(NAME + "_big")
    for i in range(3000):  # files the walk has not seen: each costs a realpath
        code = compile("def f(): pass", f"/nonexistent/site-packages/z/d{i}/m{i}.py", "exec").co_consts[0]
        setattr(slow, f"f{i}", types.FunctionType(code, {}, f"f{i}"))
    sys.modules[slow.__name__] = slow
    try:
        patched_code.forget()
        monkey = patched_code._warming
        patched_code._warming = False
        patched_code.warm_up()
        deadline = time.monotonic() + 5
        while not patched_code._walk_lock.locked() and time.monotonic() < deadline:
            time.sleep(0.001)
        held = patched_code._walk_lock.locked()
        pid = os.fork()
        if pid == 0:  # the child: a verdict within 20 s, or SIGALRM's status
            import signal

            signal.alarm(20)
            patched_code.found_once()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        patched_code._warming = monkey
    finally:
        del sys.modules[slow.__name__]
    print(f"walk lock held at the fork: {held}")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_own_folders_are_the_outermost_so_a_later_subpackage_keeps_the_records() -> None:
    # A record is kept only under the same own folders (_Walked.own): were a subpackage's folder
    # listed beside its parent's, importing it after the warm-up would judge everything again.
    import importlib

    before = patched_code._own_roots()
    importlib.import_module("fa4cache.cli")  # a subpackage, inside fa4cache's folder
    roots = patched_code._own_roots()
    assert roots == before and not any(a != b and a.startswith(b) for a in roots for b in roots), roots


def test_an_unchanged_namespace_is_answered_without_a_walk(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check at a warm process's first key: nothing changed since the warm-up's walk, so no
    # module or class is judged again; an import since (sys.modules changed, not the checked
    # modules or fa4cache's folders) keeps that so; a change in a checked module does not.
    assert [f for f in patched_code.runtime_patches(snapshot=True) if f.startswith(NAME)] == []

    def no_walk(*a: object, **k: object) -> None:
        raise AssertionError("walked again")

    monkeypatch.setattr(patched_code, "_walk", no_walk)
    if dict_versions.reader() is not None:  # and the namespaces' contents are not read either
        monkeypatch.setattr(patched_code._Snapshot, "_changed_by_contents", no_walk)
    assert _found() == []
    for name in ("_fa4cache_unrelated_probe", "fa4cache._probe_submodule"):
        sys.modules[name] = types.ModuleType(name)
    try:
        assert _found() == []
    finally:
        for name in ("_fa4cache_unrelated_probe", "fa4cache._probe_submodule"):
            del sys.modules[name]
    monkeypatch.undo()
    module.call_mask_mod = _hot_fix
    found = _found()
    assert len(found) == 1 and found[0].startswith(f"{NAME}.call_mask_mod "), found


def test_a_checked_module_imported_since_the_snapshot_is_judged_on_its_own(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The snapshot vouches for the modules it was taken with; a checked module imported since
    # (a submodule FA4 imports at its first call, whose name lands on its package) is walked
    # alone, and the snapshot stays for the next call.
    patched_code.runtime_patches(snapshot=True)
    assert patched_code._snapshot is not None
    walks: list[str] = []
    walk = patched_code._walk
    monkeypatch.setattr(patched_code, "_walk", lambda q, *a: walks.append(q) or walk(q, *a))
    late = types.ModuleType(NAME + "_late")
    late.hot = _hot_fix
    sys.modules[late.__name__] = late
    module._late = late  # as an import sets a submodule on its package
    try:
        found = _found()
        assert len(found) == 1 and found[0].startswith(f"{NAME}_late.hot "), found
        assert walks == [late.__name__] and patched_code._snapshot is not None
        module.added_fix = _hot_fix  # code added to a module the snapshot holds: judged again
        found = _found()
        assert f"{NAME}.added_fix" in " ".join(found) and NAME in walks, (found, walks)
    finally:
        del sys.modules[late.__name__]


@pytest.mark.parametrize("becomes", ["a bool", "a table", "the user's function", "the user's class"])
def test_a_module_value_that_changes_keeps_the_snapshot_only_while_it_runs_no_code(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, becomes: str
) -> None:
    # A flag or a table the library updates as it runs (cutlass's _VERIFY_TRACE_ENABLED goes
    # from None to a bool at the first call) is no patch: the first key's check still answers
    # from the snapshot, with no walk. A value that becomes code is judged.
    module.FLAG = None
    assert [f for f in patched_code.runtime_patches(snapshot=True) if f.startswith(NAME)] == []
    walks: list[str] = []
    walk = patched_code._walk
    monkeypatch.setattr(patched_code, "_walk", lambda q, *a: walks.append(q) or walk(q, *a))
    module.FLAG = {
        "a bool": True,
        "a table": {},
        "the user's function": _hot_fix,
        "the user's class": _Fixer,
    }[becomes]
    found = _found()
    if becomes in ("a bool", "a table"):
        assert found == [] and walks == [] and patched_code._snapshot is not None
    else:
        assert len(found) == 1 and found[0].startswith(f"{NAME}.FLAG "), found
        assert walks == [NAME]  # the one module that changed, judged again


def test_the_warm_up_waits_for_a_package_still_being_imported(module: types.ModuleType) -> None:
    # FA4's interface is imported from inside flash_attn.cute's __init__: a snapshot taken then
    # would miss the names the package sets after it, and the first key would walk again.
    import threading
    import time

    module.__spec__ = types.SimpleNamespace(_initializing=True)
    threading.Timer(0.3, lambda: setattr(module.__spec__, "_initializing", False)).start()
    t0 = time.monotonic()
    patched_code._settled(timeout=5)
    assert 0.25 < time.monotonic() - t0 < 4


class _Plain:  # an instance that runs no code, until its class is assigned
    pass


@pytest.mark.parametrize("lands", ["a flag's new value", "a submodule's name on its package"])
def test_a_value_landing_while_the_snapshot_is_taken_is_watched_as_it_is_held(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, lands: str
) -> None:
    # The warm-up walks for a second while the process goes on: a value set after its module
    # was walked and before the tags are read is in place when they are read, and its module's
    # tag never moves again. A later change to that value (its class assigned one that runs
    # code) must still be seen.
    module.FLAG = None
    taken = patched_code._Snapshot.tagged
    late = _Plain() if lands == "a flag's new value" else types.ModuleType(NAME + ".late")

    def tagged_after_a_change(snap: patched_code._Snapshot) -> patched_code._Snapshot:
        if lands == "a flag's new value":
            module.FLAG = late
        else:
            module.late = late
        return taken(snap)

    monkeypatch.setattr(patched_code._Snapshot, "tagged", tagged_after_a_change)
    assert [f for f in patched_code.runtime_patches(snapshot=True) if f.startswith(NAME)] == []
    late.__class__ = _Fixer if lands == "a flag's new value" else _CallableModule
    found = _found()
    name = "FLAG" if lands == "a flag's new value" else "late"
    assert len(found) == 1 and found[0].startswith(f"{NAME}.{name} "), found


class _CopyingModule(types.ModuleType):  # answers vars() with a copy of what it holds
    @property  # type: ignore[misc]
    def __dict__(self) -> dict[str, object]:  # type: ignore[override]
        return dict(types.ModuleType.__dict__["__dict__"].__get__(self))


class _CopyingMeta(type):  # a class's vars() as a copy
    @property  # type: ignore[misc]
    def __dict__(self) -> types.MappingProxyType[str, object]:  # type: ignore[override]
        return types.MappingProxyType(dict(type.__dict__["__dict__"].__get__(self)))


_CopyingModule.__module__ = _CopyingMeta.__module__ = "os.path"  # (as a library's)


@pytest.mark.parametrize("copies", ["a module", "a class"])
def test_a_namespace_shown_as_a_copy_is_compared_by_its_contents(
    module: types.ModuleType, copies: str
) -> None:
    # A tag says something only of the dict that holds the names: where vars() answers with
    # another, the snapshot compares contents.
    class Defined(metaclass=_CopyingMeta):
        pass

    Defined.__module__ = NAME
    module.Defined = Defined
    if copies == "a module":
        module.__class__ = _CopyingModule
    try:
        assert [f for f in patched_code.runtime_patches(snapshot=True) if f.startswith(NAME)] == []
        assert patched_code._snapshot is not None and patched_code._snapshot.tags is None
        if copies == "a module":
            module.call_mask_mod = _hot_fix
        else:
            Defined.apply_mask = _hot_fix
        found = _found()
    finally:
        module.__class__ = types.ModuleType
    want = f"{NAME}.call_mask_mod " if copies == "a module" else f"{NAME}.Defined.apply_mask "
    assert len(found) == 1 and found[0].startswith(want), found


def test_a_class_made_by_text_code_without_a_module_is_no_failure(module: types.ModuleType) -> None:
    # type() called from text code whose globals have no __name__ leaves the class without a
    # __module__: reading it raised, and the whole check counted as failed (every kernel in memory).
    ns: dict[str, object] = {}
    exec("Made = type('Made', (), {})", ns)
    made = ns["Made"]
    assert "__module__" not in vars(made)  # type: ignore[arg-type]
    module.thing = made()  # type: ignore[operator]
    assert [f for f in patched_code.runtime_patches(snapshot=True) if f.startswith(NAME)] == []
    patched_code.forget()
    assert not any("failed" in f for f in patched_code.found_once())
