"""The generation calls of ``fa4cache warm --hf-config PATH --generation``
(:class:`~fa4cache.aot.plan.GenerationCall`), made on fake CUDA tensors: the FA4
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

from typing import Any

from fa4cache.aot.plan import GenerationCall

# Queries of a step with prompts: more than one tile of (query, head) rows, the other kernel.
_PREFILL_QUERIES = 256
# Keys of the split decode call (more than split_kv.MIN_KEYS).
_SPLIT_KEYS = 2048


def calls(g: GenerationCall) -> int:
    """Make each generation call of ``g``'s layer kind on fake tensors; returns how many (the
    kernel kinds)."""
    import torch
    from fa4cache.adapters.compile.warm_specs import _absorb_fake_data_ptr_warning
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4cache.decode import choose, key_ranges, kv_cache, paged, step_ranges

    heads, heads_kv, head_dim, window, softcap = g.heads, g.heads_kv, g.head_dim, g.window, float(g.softcap)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[g.dtype]

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
    made = 0
    try:
        for Tq in (1, _PREFILL_QUERIES):
            cache_step(mask, Tq, window)
            made += 1
            # Continuous batching: the step's queries against each sequence's keys.
            with FakeTensorMode(), torch.no_grad():
                n_q = B if Tq == 1 else _PREFILL_QUERIES
                cq = torch.empty(B + 1, dtype=torch.int32, device="cuda")
                ck = torch.empty(B + 1, dtype=torch.int32, device="cuda")
                q = torch.empty(1, heads, n_q, head_dim, dtype=dtype, device="cuda")
                k = torch.empty(1, heads_kv, 2 * T, head_dim, dtype=dtype, device="cuda")
                max_q = 1 if Tq == 1 else _PREFILL_QUERIES // 2
                paged.varlen_forward(q, k, k, cq, ck, max_q, T, True, window, head_dim**-0.5, softcap)
            made += 1
        # The compiled path's split decode (fa4cache.decode.split_kv: FA4 with its LSE), where
        # the target splits a long cache at batch 1.
        split = choose.split_plan(heads_kv, _SPLIT_KEYS, head_dim) if window is None else None
        if split is not None:
            cache_step(torch.ones(1, _SPLIT_KEYS, dtype=torch.bool), 1, None, split)
            made += 1
    finally:
        step_ranges.sequences = real_sequences  # type: ignore[assignment]
    return made
