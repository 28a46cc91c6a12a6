"""adapters/fa4/export_only.py: a GPU-blind process compiles the kernels it only exports
without the DSL's JIT engine, a GPU process its forward, and the store gets the same bytes as
with it."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from fa4cache.store.paths import LAYOUT
from tests.conftest import run_worker

pytestmark = pytest.mark.compile


def _objects(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted((d / LAYOUT).glob("*/*/*.o"))}


def test_kernels_compiled_without_the_engine_export_the_same_bytes(
    doc_store: dict[str, Any], tmp_path: Path
) -> None:
    # doc_store's process compiled its kernel set export-only (the default here: no GPU); this
    # one builds the DSL's engines as a GPU process would, for the first of the same layouts.
    assert doc_store["result"]["engineless"] == 4, doc_store["result"]
    r = run_worker(
        tmp_path / "cache", "geometries", "--geometries", "1", "--seed", "7", PYTHONHASHSEED="1",
        FA4CACHE_EXPORT_ONLY="0", FA4CACHE_GC_DEFER="0", WORKER_WATCH_GC="1",
    )  # fmt: skip
    assert r["compiles"] == 4 and r["engineless"] == 0, r
    # (and with the collector as it is: doc_store's kernels were compiled with full collections deferred)
    assert r["deferred_traces"] == [False] * 4, r
    with_engine, without = _objects(tmp_path / "cache"), _objects(doc_store["dir"])
    assert len(with_engine) == 4 and with_engine.keys() == without.keys()
    assert with_engine == without


def test_a_gpu_process_compiles_only_its_forward_without_the_engine(
    doc_store: dict[str, Any], tmp_path: Path
) -> None:
    # A process with a GPU (as far as export_only can tell): its forward runs from the bytes it
    # publishes (FA4's forward calls it through the compile cache, where the stand-in is); its
    # backward kernels keep the engine (4.0.0b40's backward calls its kernel directly).
    r = run_worker(
        tmp_path / "cache", "geometries", "--geometries", "1", "--seed", "7", PYTHONHASHSEED="1",
        WORKER_SEES_GPU="1", WORKER_WATCH_GC="1",
    )  # fmt: skip
    assert r["compiles"] == 4 and r["engineless_kinds"] == ["fwd"] and r["stand_ins"] == ["fwd"], r
    # every kernel, engine-less or not, traced with full collections deferred, and the
    # collector's thresholds as they were after
    assert r["deferred_traces"] == [True] * 4 and r["gc_threshold_after"] == list(gc.get_threshold()), r
    assert _objects(tmp_path / "cache") == _objects(doc_store["dir"])


def test_a_gpu_process_keeps_the_engine_where_the_forward_is_not_verified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fa4cache.adapters.fa4 import export_only

    from fa4cache import fa4_releases

    export_only.disable()
    monkeypatch.setattr(export_only, "gpu_blind", lambda: False)
    real_on = fa4_releases.on
    try:
        monkeypatch.setattr(
            fa4_releases, "on", lambda c: c is not fa4_releases.Coupling.ENGINELESS_FORWARD and real_on(c)
        )
        monkeypatch.setenv("FA4CACHE_GC_DEFER", "0")  # (the GC deferral would wrap the compile still)
        assert not export_only.enable()  # a GPU, and an FA4 whose forward is not verified: the DSL's own
        monkeypatch.setattr(fa4_releases, "on", real_on)
        if not fa4_releases.on(fa4_releases.Coupling.ENGINELESS_FORWARD):
            pytest.skip("the installed FA4 is not a release verified for engine-less forwards")
        assert export_only.enable()
    finally:
        export_only.disable()


def test_a_gpu_process_with_an_unverified_forward_never_compiles_engine_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The wrapper is on for the GC deferral there, but export-only compiles stay off for the
    # process, even where the device files later say no GPU (before the deferral, enable() said
    # False and nothing was wrapped).
    import cutlass
    import cutlass.cute as cute
    from fa4cache.adapters.fa4 import compile_cache, export_only

    from fa4cache import fa4_releases

    if export_only._dsl_version() not in export_only.VERIFIED_DSL:
        pytest.skip("the DSL release is not verified: nothing is wrapped")
    export_only.disable()
    monkeypatch.setattr(export_only, "gpu_blind", lambda: False)
    real_on = fa4_releases.on
    monkeypatch.setattr(
        fa4_releases, "on", lambda c: c is not fa4_releases.Coupling.ENGINELESS_FORWARD and real_on(c)
    )

    def host_only(a):  # type: ignore[no-untyped-def]
        cute.printf("a=%d\n", a)

    host_only.__annotations__ = {"a": cutlass.Int32}
    host_only = cute.jit(host_only)
    try:
        assert export_only.enable()  # (for the deferral)
        monkeypatch.setattr(export_only, "gpu_blind", lambda: True)  # the device files change
        monkeypatch.setattr(export_only, "library_kernel", lambda func: True)  # as if FA4's
        compile_cache._tl.pending = [(object(), "a pending miss")]
        compiled = cute.compile(host_only, 3)
    finally:
        compile_cache._tl.pending = []
        export_only.disable()
    assert getattr(compiled, "engine", None) is not None


def test_only_fa4s_kernels_lose_the_engine_a_host_function_keeps_it() -> None:
    # While a miss is pending in this thread, a host-only @cute.jit function of the user's is
    # compiled as the DSL would (an engine, and it runs here); FA4's own functions are the
    # ones compiled export-only.
    import cutlass
    import cutlass.cute as cute
    import flash_attn.cute.interface as fa4
    from fa4cache.adapters.fa4 import compile_cache, export_only

    if not export_only.enable():
        pytest.skip(
            "export-only compiles are off here (a GPU is visible, or the DSL release is not verified)"
        )

    def host_only(a):  # type: ignore[no-untyped-def]
        cute.printf("a=%d\n", a)

    host_only.__annotations__ = {"a": cutlass.Int32}  # objects: this file's annotations are text
    host_only = cute.jit(host_only)

    assert export_only.library_kernel(fa4._flash_attn_fwd) and not export_only.library_kernel(host_only)
    compile_cache._tl.pending = [(object(), "a pending miss")]
    try:
        assert compile_cache.store_miss_pending()
        compiled = cute.compile(host_only, 3)
    finally:
        compile_cache._tl.pending = []
        export_only.disable()
    assert getattr(compiled, "engine", None) is not None
    compiled(4)  # runs: the DSL's own engine
