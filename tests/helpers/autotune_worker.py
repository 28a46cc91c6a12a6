"""A real process that runs FA4 4.0.0b40's autotuner under fa4cache on the CPU (tests/adapters/fa4/test_autotune.py).

FA4 is cross-compiled for an H200 (sm_90, 132 SMs) under FakeTensorMode. Prints one JSON line
(prefixed ``RESULT ``) per step. Usage::

    python -m tests.helpers.autotune_worker compile_one
    python -m tests.helpers.autotune_worker coupling
    python -m tests.helpers.autotune_worker tune STEPS_JSON
    # STEPS_JSON: [{"seqlen": 256, "candidates": ["default", "tile_n64"], "fault": "lock"}, ...]
    # Optional: "fault" ("key encoding", "lock" or "store write" raises in that step), "wait" (a
    # file to wait for before tuning), "hold" (seconds the stand-in timing takes).

``tune`` calls ``tune_fwd_config`` as a user would, with these stand-ins for what only a GPU
can answer (:func:`gpu_standins`): the timing (``_measure_configs``: a deterministic chooser, the
smallest ``tile_n`` wins), the device queries (``torch.cuda.get_device_capability`` answers the
cross-compile target, ``torch.cuda.device`` and ``is_current_stream_capturing`` a CPU-only
torch cannot enter) and FA4's refusal of fake tensors (it wants real CUDA tensors to time).
Everything else is real: FA4's normalisation and checks, its compile barrier and miss probe,
the compile children and the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")

HEADS, HEAD_DIM = 2, 64
CALLS = {"measure": 0, "barrier": 0, "compile_one": 0}
HOLD = {"seconds": 0.0}


def _result(**kw: Any) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def forward_kwargs(seqlen: int) -> dict[str, Any]:
    """A causal bf16 forward's arguments as fake CUDA tensors (what the tuner is given)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, seqlen, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(1, seqlen, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(1, seqlen, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    return {"q": q, "k": k, "v": v, "causal": True}


def encode(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call as FA4's ``_compile_barrier`` hands it to a compile child."""
    import torch

    return {
        n: (
            {
                "tensor": True,
                "shape": list(v.shape),
                "stride": list(v.stride()),
                "dtype": str(v.dtype).removeprefix("torch."),
            }
            if isinstance(v, torch.Tensor)
            else v
        )
        for n, v in kwargs.items()
    }


def candidates(names: list[str], autotune: Any) -> list[Any]:
    """FA4's default config for the call and variants of it. The default is read from the key
    FA4 asks its compile cache for, listed by fa4cache's selector: nothing compiles or loads."""
    from fa4cache.adapters.fa4 import compile_cache
    from torch._subclasses.fake_tensor import FakeTensorMode

    asked: list[Any] = list(autotune._flash_attn_fwd.compile_cache.cache)
    prev = compile_cache.select(lambda cache, key: asked.append(key) or True)
    try:
        with FakeTensorMode():
            autotune._flash_attn_fwd(
                **autotune._decode_kwargs(encode({**forward_kwargs(256), "_arch": 90}), "cuda:0")
            )
    finally:
        compile_cache.select(prev)
    default = next(k[0] for k in asked if isinstance(k, tuple) and dataclasses.is_dataclass(k[0]))
    variants = {"default": default, "tile_n64": dataclasses.replace(default, tile_n=64)}
    return [variants[n] for n in names]


def gpu_standins(autotune: Any) -> None:
    """What only a GPU answers (see the module docstring); each call is counted."""
    import torch

    real_normalize, real_barrier, real_compile_one = (
        autotune._normalize_kwargs,
        autotune._compile_barrier,
        autotune._compile_one,
    )

    class _NoFakes:  # FA4 refuses fake tensors: nothing is an instance of this
        pass

    def normalize(kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_set(autotune, "FakeTensor", _NoFakes))
            stack.enter_context(_set(torch.cuda, "get_device_capability", lambda device=None: (9, 0)))
            return real_normalize(kwargs)

    def barrier(*args: Any, **kwargs: Any) -> Any:
        CALLS["barrier"] += 1
        return real_barrier(*args, **kwargs)

    def compile_one(*args: Any, **kwargs: Any) -> Any:
        CALLS["compile_one"] += 1
        return real_compile_one(*args, **kwargs)

    def measure(configs: Any, kwargs: Any) -> Any:
        CALLS["measure"] += 1
        time.sleep(HOLD["seconds"])  # a tuning that takes a while (the single-flight test)
        return min(configs, key=lambda c: c.tile_n)

    for spy in (normalize, barrier, compile_one, measure):
        # Stand-ins that call FA4's own code (or answer what a GPU would): the generated code
        # is FA4's, so fa4cache keeps storing its kernels.
        spy.__fa4cache_codegen_neutral__ = True  # type: ignore[attr-defined]
    autotune._normalize_kwargs = normalize
    autotune._compile_barrier = barrier
    autotune._compile_one = compile_one
    autotune._measure_configs = measure
    torch.cuda.device = lambda device: contextlib.nullcontext()
    torch.cuda.is_current_stream_capturing = lambda: False


@contextlib.contextmanager
def _set(obj: Any, name: str, value: Any) -> Any:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


def _fault(stage: str | None, store: Any) -> Any:
    """Make one of fa4cache's stages raise (tests/store/test_faults.py does the same for kernels)."""
    from fa4cache.adapters.fa4 import autotune as routed

    from fa4cache.errors import UnstableKeyError

    def raise_(error: Exception) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise error

        return fail

    if stage is None:
        return contextlib.nullcontext()
    if stage == "key encoding":
        return _set(routed, "shape_class", raise_(UnstableKeyError("injected")))
    if stage == "lock":
        return _set(store.locks, "acquire", raise_(OSError("injected")))
    if stage == "store write":
        return _set(store, "publish_bytes", raise_(OSError("injected")))
    raise ValueError(f"unknown fault {stage!r}")


def _counts(store: Any) -> dict[str, Any]:
    store.counters.flush()
    c = store.counters.values
    return {
        "compiles": int(c["compiles"]),
        "misses": int(c["misses"]),
        "disk_hits": int(c["disk_hits"]),
        "autotune_hits": int(store.counters.by_kind.get("autotune", {}).get("disk_hits", 0)),
    }


def _pending_locks(store: Any) -> int:
    """Keys whose lock this process holds: pending compiles, or a stored key's lock not free."""
    from fa4cache.adapters import patch
    from fa4cache.adapters.fa4 import compile_cache

    from fa4cache.store.locks import release

    held = sum(len(p.cache._pending) for p in patch._installed.patches)
    held += len(getattr(compile_cache._tl, "pending", None) or [])
    for e in store.entries():
        lock = store.locks.try_lock(e.ref.digest)
        held += lock is None
        release(lock)
    return held


def _routed(autotune: Any) -> dict[str, bool]:
    """Which of FA4's autotuner names are fa4cache's."""
    return {
        "_compile_one": getattr(autotune._compile_one, "__fa4cache_autotune__", False),
        "tune_fwd_config": getattr(autotune.tune_fwd_config, "__fa4cache_autotune__", False),
        "CUTE_DSL_CACHE_ENABLED": autotune.CUTE_DSL_CACHE_ENABLED,
    }


def coupling() -> None:
    """Routed under install(), FA4's own after uninstall(), and never where the coupling is off."""
    import fa4cache
    from fa4cache import fa4_releases

    fa4cache.install()
    from flash_attn.cute import autotune

    installed = _routed(autotune)
    fa4cache.uninstall()
    uninstalled = _routed(autotune)
    on = fa4_releases.on
    fa4_releases.on = lambda c: c is not fa4_releases.Coupling.AUTOTUNE and on(c)  # as on an unverified FA4
    fa4cache.install()
    _result(installed=installed, uninstalled=uninstalled, coupling_off=_routed(autotune))


def main() -> None:
    if sys.argv[1] == "coupling":
        coupling()
        return
    import fa4cache

    store = fa4cache.install()
    from flash_attn.cute import autotune

    action = sys.argv[1]
    if action == "compile_one":
        # One candidate compiled by the (patched) _compile_one, then FA4's own miss probe.
        from torch._subclasses.fake_tensor import FakeTensorMode

        config = candidates(["tile_n64"], autotune)[0]
        kwargs = {**forward_kwargs(256), "_arch": 90}
        encoded = encode(kwargs)
        before = {e.ref for e in store.entries(kind="fwd")}
        with FakeTensorMode():
            fake = autotune._decode_kwargs(encoded, "cuda:0")
            missed_before = autotune._missing_kernels(config, fake)
        t0 = time.perf_counter()
        autotune._compile_one(config, encoded, kwargs["v"].device)
        child_seconds = time.perf_counter() - t0
        with FakeTensorMode():
            fake = autotune._decode_kwargs(encoded, "cuda:0")
            missed_after = autotune._missing_kernels(config, fake)
        published = {e.ref for e in store.entries(kind="fwd")} - before
        _result(
            patched=getattr(autotune._compile_one, "__fa4cache_autotune__", False),
            missed_before=len(missed_before),
            missed_after=len(missed_after),
            published=len(published),
            child_seconds=child_seconds,
            pending_locks=_pending_locks(store),
            **_counts(store),
        )
        return

    gpu_standins(autotune)
    warnings = _Warnings()
    logging.getLogger("fa4cache").addHandler(warnings)
    for step in json.loads(sys.argv[2]):
        configs = candidates(step["candidates"], autotune)
        before = dict(CALLS)
        counts = _counts(store)
        warnings.seen.clear()
        HOLD["seconds"] = step.get("hold", 0.0)
        while step.get("wait") and not os.path.exists(step["wait"]):  # line processes up
            time.sleep(0.01)
        with _fault(step.get("fault"), store):
            t0 = time.perf_counter()
            winner = autotune.tune_fwd_config(configs, forward_kwargs(step["seqlen"]), compile_workers=2)
            seconds = time.perf_counter() - t0
        after = _counts(store)
        _result(
            step=step,
            warnings=list(warnings.seen),
            entries=len(list(store.entries(kind="autotune"))),
            winner=dataclasses.asdict(winner),
            index=configs.index(winner),
            seconds=seconds,
            pending_locks=_pending_locks(store),
            **{f"{k}_calls": CALLS[k] - before[k] for k in CALLS},
            **{k: after[k] - counts[k] for k in after},
        )


if __name__ == "__main__":
    main()
