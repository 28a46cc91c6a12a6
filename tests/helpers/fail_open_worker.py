"""A real process that makes one stage of fa4cache raise, then calls FA4 as a user would.

Usage: ``python -m tests.helpers.fail_open_worker STAGE [STAGE ...]`` (the store is
``$FA4CACHE_DIR``). Each stage gets a kernel of its own (another head dim or causality),
compiled for real on the CPU (sm_90, fake CUDA tensors). Prints one ``RESULT`` JSON line per
stage: whether the FA4 call returned and what it returned, the warnings fa4cache logged, what
the store holds, and whether the kernel's lock is free again.

``patch`` is special: the failure is injected before FA4 is imported, in the import hook.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")

# One (head_dim, causal) per stage: a fresh kernel each, so no stage hits another's.
CALLS = {
    "none": (64, False),
    "key encoding": (64, True),
    "code identity": (128, False),
    "store read": (128, True),
    "store write": (96, False),
    "lock": (96, True),
    "remote tier": (192, False),
    "compile server": (192, True),
    "patch": (64, True),
}


class Injected(RuntimeError):
    """The fault this worker injects."""


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise Injected("injected by the fail-open test")


class FailingRemote:
    """A cluster tier whose peers vanish: every call raises (a remote tier must fail open)."""

    name = "failing-remote"
    last_fetch_seconds = 0.0
    last_source = ""

    def __init__(self, root: Any) -> None:
        self.root = root

    def get(self, ref: Any) -> Any:
        raise Injected("injected: the peer vanished")

    def active(self) -> bool:
        return True

    def acquire(self, digest: str, wait: float) -> bool:
        raise Injected("injected: the lease service vanished")

    def release(self, digest: str) -> None:
        raise Injected("injected: the lease service vanished")

    def announce(self, ref: Any) -> None:
        raise Injected("injected: the peer vanished")

    def served_since_last(self) -> int:
        return 0

    def worker_env(self) -> dict[str, str]:
        return {}


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("fa4cache"):
            self.messages.append(record.getMessage())


def _mask_mod() -> Any:
    import cutlass.cute as cute

    @cute.jit
    def near_diagonal(b: Any, h: Any, m_idx: Any, n_idx: Any, seqlen_info: Any, aux_tensors: Any) -> Any:
        return n_idx <= m_idx + 8

    return near_diagonal


def _inject(stage: str, monkey: list[tuple[Any, str, Any]]) -> None:
    from fa4cache.adapters.fa4 import compile_cache, events, keys

    from fa4cache.store.locks import StoreLocks
    from fa4cache.store.store import Store

    def put(obj: Any, name: str, value: Any) -> None:
        monkey.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    if stage == "key encoding":
        put(compile_cache, "encode_key", _raise)
    elif stage == "code identity":
        put(keys, "current_digest", _raise)
    elif stage == "store read":
        put(Store, "load", _raise)
    elif stage == "store write":
        put(Store, "publish", _raise)
    elif stage == "lock":
        put(StoreLocks, "acquire", _raise)
    elif stage == "compile server":
        events.listen(_raise)
        monkey.append((events, "_listeners", list(events._listeners[:-1])))


def _call(stage: str) -> dict[str, Any]:
    import torch
    from flash_attn.cute import interface as fi
    from torch._subclasses.fake_tensor import FakeTensorMode

    head_dim, causal = CALLS[stage]
    mask_mod = _mask_mod() if stage == "code identity" else None
    with FakeTensorMode():
        q = torch.empty(1, 256, 2, head_dim, dtype=torch.bfloat16, device="cuda")
        out, lse, *_ = fi._flash_attn_fwd(q, q, q, causal=causal, mask_mod=mask_mod, return_lse=True)
        return {"out": list(out.shape), "out_dtype": str(out.dtype), "lse": list(lse.shape)}


def _state(store: Any) -> dict[str, Any]:
    root = store.root
    files = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    from fa4cache.adapters import patch

    inst = patch._installed
    locked = []
    if inst is not None:
        for p in inst.patches:
            for key in p.cache._pending:
                locked.append(repr(key)[:80])
    return {
        "objects": sum(f.endswith(".o") for f in files),
        "partial": [f for f in files if os.path.basename(f).startswith(".tmp.")],
        "pending_locks": locked,
        "routed": inst is not None,
    }


def main() -> None:
    stages = sys.argv[1:]
    handler = Warnings()
    logging.getLogger().addHandler(handler)
    if stages == ["patch"]:
        from fa4cache.adapters.fa4 import interval_masking

        interval_masking.enable = _raise  # raised in the import hook, once FA4 is imported
        os.environ["FA4CACHE_TRY_COUPLINGS"] = "interval_masking"
    if "remote tier" in stages:
        os.environ["FA4CACHE_REMOTE_TIER"] = f"{__name__}:FailingRemote"
    import fa4cache

    store = fa4cache.install()
    for stage in stages:
        monkey: list[tuple[Any, str, Any]] = []
        before = len(handler.messages)
        objects_before = _state(store)["objects"]
        if stage != "patch":
            _inject(stage, monkey)
        try:
            returned: dict[str, Any] = _call(stage)
            error = None
        except BaseException as e:  # what the user would see
            returned, error = {}, f"{type(e).__name__}: {e}"
        finally:
            for obj, name, value in reversed(monkey):
                setattr(obj, name, value)
        state = _state(store)
        row = {
            "stage": stage,
            "error": error,
            "returned": returned,
            "warnings": handler.messages[before:],
            "new_objects": state["objects"] - objects_before,
            **state,
        }
        print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
