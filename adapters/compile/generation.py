"""``fa4cache warm --hf-config PATH --generation``: cross-compile, on the CPU, the FA4
kernels that generation with ``attn_implementation="fa4cache"`` runs for that model
(:mod:`fa4cache.decode`): a KV-cache step (decode, and prefill into a static cache) and a
continuous-batching step (decode, and steps with prompts), for full and sliding layers, and
the compiled path's split decode call (:mod:`fa4cache.decode.split_kv`).

Each is one call of the adapter's own op body on fake CUDA tensors (the per-row lengths
are computed on real CPU tensors first, as the masks of the packed path are); batch size
and cache length do not reach FA4's compile key, so one representative shape per kind
covers them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fa4cache.errors import quiet_library_warnings

# Queries of a step with prompts: more than one tile of (query, head) rows, the other kernel.
_PREFILL_QUERIES = 256
# Keys of the split decode call (more than split_kv.MIN_KEYS).
_SPLIT_KEYS = 2048


@dataclass(frozen=True)
class GenerationWarm:
    kernels: int  # calls made (one per kernel kind)
    compiles: int
    present: int
    seconds: float
    errors: tuple[str, ...]


def _shapes(cfg: dict[str, Any]) -> tuple[int, int, int, list[int | None], float]:
    from fa4cache.aot.model_config import _positive_int, sliding_window

    heads = _positive_int(cfg, "num_attention_heads")
    heads_kv = _positive_int(cfg, "num_key_value_heads") if "num_key_value_heads" in cfg else heads
    head_dim = cfg.get("head_dim") or _positive_int(cfg, "hidden_size") // heads
    w = sliding_window(cfg)
    types = cfg.get("layer_types")
    windows: list[int | None] = [None]
    if w is not None:  # transformers' window of w keys is FA4's w - 1 before the query
        some_full = isinstance(types, list) and "full_attention" in types
        windows = ([None] if some_full else []) + [w - 1]
    return heads, heads_kv, head_dim, windows, float(cfg.get("attn_logit_softcapping") or 0.0)


def _calls(heads: int, heads_kv: int, head_dim: int, window: int | None, softcap: float, dtype: Any) -> int:
    """Make each generation call of one layer kind on fake tensors; returns how many (the
    kernel kinds)."""
    import torch
    from fa4cache.adapters.compile.warm_specs import _absorb_fake_data_ptr_warning
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4cache.decode import choose, key_ranges, kv_cache, paged, step_ranges

    def cache_step(mask: Any, Tq: int, window: int | None, split: tuple[int, int] | None = None) -> None:
        """One KV-cache call (the op's body) over ``mask``'s rows and slots, ``Tq`` queries."""
        B, T = mask.shape
        lengths = key_ranges._sequences(mask, None, B, heads_kv, T, split=split)
        with FakeTensorMode(), torch.no_grad():
            # torch warns once per process when the DSL reads a fake tensor's data pointer,
            # from C++ where no filter applies: take that warning here, filtered (-j warm
            # workers took theirs in their own processes, not in this one).
            _absorb_fake_data_ptr_warning()
            fake = tuple(torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in lengths)
            step_ranges.sequences = lambda *a, fake=fake, **kw: fake  # type: ignore[assignment]
            q = torch.empty(B, heads, Tq, head_dim, dtype=dtype, device="cuda")
            k = torch.empty(B, heads_kv, T, head_dim, dtype=dtype, device="cuda")
            kv_cache.forward(q, k, k, mask, None, True, window, head_dim**-0.5, softcap)

    B, T = 2, 300
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :5] = False
    real_sequences = step_ranges.sequences
    calls = 0
    try:
        for Tq in (1, _PREFILL_QUERIES):
            cache_step(mask, Tq, window)
            calls += 1
            # Continuous batching: the step's queries against each sequence's keys.
            with FakeTensorMode(), torch.no_grad():
                n_q = B if Tq == 1 else _PREFILL_QUERIES
                cq = torch.empty(B + 1, dtype=torch.int32, device="cuda")
                ck = torch.empty(B + 1, dtype=torch.int32, device="cuda")
                q = torch.empty(1, heads, n_q, head_dim, dtype=dtype, device="cuda")
                k = torch.empty(1, heads_kv, 2 * T, head_dim, dtype=dtype, device="cuda")
                max_q = 1 if Tq == 1 else _PREFILL_QUERIES // 2
                paged.varlen_forward(q, k, k, cq, ck, max_q, T, True, window, head_dim**-0.5, softcap)
            calls += 1
        # The compiled path's split decode (fa4cache.decode.split_kv: FA4 with its LSE), where
        # the target splits a long cache at batch 1.
        split = choose.split_plan(heads_kv, _SPLIT_KEYS, head_dim) if window is None else None
        if split is not None:
            cache_step(torch.ones(1, _SPLIT_KEYS, dtype=torch.bool), 1, None, split)
            calls += 1
    finally:
        step_ranges.sequences = real_sequences  # type: ignore[assignment]
    return calls


GENERATION_KEY = "generation"  # a sidecar spec {"generation": {...}, "arch": ...}: warm --replay


def generation_items(cfg: dict[str, Any], dtypes: list[str], arch: str) -> list[dict[str, Any]]:
    """The generation calls of the model ``cfg``, one per dtype and window, as the specs their
    entries record (``warm --replay`` compiles them again from these)."""
    heads, heads_kv, head_dim, windows, softcap = _shapes(cfg)
    shape = {"heads": heads, "heads_kv": heads_kv, "head_dim": head_dim, "softcap": softcap}
    return [
        {GENERATION_KEY: {**shape, "dtype": d, "window": window}, "arch": arch}
        for d in dtypes
        for window in windows
    ]


def check_item(item: Any) -> dict[str, Any]:
    """A recorded generation spec, checked (``ValueError`` for one this version cannot run)."""
    g = item.get(GENERATION_KEY) if isinstance(item, dict) else None
    ok = (
        isinstance(g, dict)
        and all(
            isinstance(g.get(k), int) and not isinstance(g.get(k), bool)
            for k in ("heads", "heads_kv", "head_dim")
        )
        and g.get("dtype") in ("bf16", "fp16")
        and (g.get("window") is None or isinstance(g.get("window"), int))
        and isinstance(g.get("softcap"), (int, float))
        and isinstance(item.get("arch"), str)
    )
    if not ok:
        raise ValueError(f"not a generation spec: {item!r:.120}")
    return item


def warm_generation_items(items: list[dict[str, Any]], *, cache_dir: str | None = None) -> GenerationWarm:
    """Compile the generation calls ``items`` (:func:`generation_items`, or what the store
    recorded) into the store; each entry records its item as its spec."""
    import torch
    from fa4cache.adapters.patch import fold_all_hits, install

    from fa4cache.store.runtime import record_spec

    store = install(cache_dir)
    fold_all_hits()
    before = store.counts()
    t0 = time.perf_counter()
    errors = []
    calls = 0
    for item in items:
        g = item[GENERATION_KEY]
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[g["dtype"]]
        try:
            # quiet: fake tensors, torch's data-pointer warning is noise here
            with record_spec(item), quiet_library_warnings():
                calls += _calls(g["heads"], g["heads_kv"], g["head_dim"], g["window"], g["softcap"], dtype)
        except Exception as e:  # reported by the CLI; the other kinds still compile
            errors.append(f"{g['dtype']} window={g['window']}: {type(e).__name__}: {e}")
    fold_all_hits()
    store.flush_counters()
    c = store.counts()
    return GenerationWarm(
        kernels=calls,
        compiles=int(c["compiles"] - before["compiles"]),
        present=int(c["disk_hits"] - before["disk_hits"] + c["memory_hits"] - before["memory_hits"]),
        seconds=time.perf_counter() - t0,
        errors=tuple(errors),
    )
