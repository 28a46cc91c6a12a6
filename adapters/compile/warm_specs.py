"""Compile one kernel spec on the CPU (what the warm runner, :mod:`.runner`, does per spec).

FA4 cross-compiles for a named arch on the CPU when called under
``torch._subclasses.fake_tensor.FakeTensorMode`` with ``device="cuda"`` tensors: the
compile cache sees exactly the keys a real call on that arch would produce, so the
kernels land in the store under the same digests. The backward is compiled by
calling FA4's ``_flash_attn_bwd`` directly (autograd on fake CUDA tensors is not
available on a CPU build of torch).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fa4cache.aot.spec import KernelSpec
from fa4cache.errors import quiet_library_warnings
from fa4cache.store.runtime import record_spec

log = logging.getLogger(__name__)


def _fake_like(t: Any) -> Any:
    import torch

    if t is None:
        return None
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cuda")


def _fake_mask(mask: Any) -> dict[str, Any]:
    """``flash_attn_func`` keyword arguments of ``mask``, on fake CUDA tensors."""
    return dict(fake_copy(mask))


def fake_copy(mask: Any) -> Any:
    """``mask`` with every tensor replaced by a fake CUDA tensor of the same layout (call
    inside ``FakeTensorMode``): build masks on real CPU tensors, then hand FA4 fakes."""
    import dataclasses

    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    def bs(x: Any) -> Any:
        return (
            None
            if x is None
            else BlockSparseTensorsTorch(*(_fake_like(v) if hasattr(v, "stride") else v for v in x))
        )

    varlen = None if mask.varlen is None else mask.varlen.map_tensors(_fake_like)
    return dataclasses.replace(
        mask,
        aux_tensors=[_fake_like(t) for t in mask.aux_tensors],
        block_sparse_tensors=bs(mask.block_sparse_tensors),
        block_sparse_tensors_bwd=bs(mask.block_sparse_tensors_bwd),
        varlen=varlen,
    )


def fake_varlen_call(mask: Any, q: Any, k: Any, v: Any, *, backward: bool, softcap: float = 0.0) -> None:
    """What ``fa4cache.attention`` runs for ``mask`` on its varlen path, on fake CUDA
    tensors (call inside ``FakeTensorMode``, where autograd cannot run): the forward, then
    the backward by calling FA4's ``_flash_attn_bwd`` as the autograd functions do."""
    import torch

    from fa4cache.ops import varlen_calls

    q2, k2, v2 = (varlen_calls.flat_tokens(t) for t in (q, k, v))
    calls = mask.varlen.map_tensors(_fake_like).calls
    out, lse = varlen_calls.forward(q2, k2, v2, calls, None, softcap)
    if backward:
        varlen_calls.backward(q2, k2, v2, out, torch.empty_like(out), lse, calls, None, softcap)


def _absorb_fake_data_ptr_warning() -> None:
    """FA4 hands fake tensors to the DSL, which reads their data pointer (harmless while
    tracing: nothing runs). torch warns about that once per process, from C++ where no
    Python filter applies; take that one warning here, where it can be filtered, so that
    it is not printed. (Call inside ``FakeTensorMode``.)"""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        torch.empty(1, device="cuda").data_ptr()


def build_mask(spec: KernelSpec) -> Any | None:
    """A representative (CPU) mask for ``spec``; the geometry does not affect the kernel."""
    import torch

    from fa4cache.masks import make_document_mask, make_draft_block_mask

    T = spec.seqlen
    if spec.mask in ("none", "causal"):
        return None
    if spec.mask == "draft_block":
        ctx = max(T // 2, 1)
        k = max((T - ctx) // spec.block_size, 1)
        anchors = torch.linspace(0, ctx - 1, k).long().view(1, k).expand(spec.batch, k)
        return make_draft_block_mask(anchors, context_len=ctx, draft_block_size=spec.block_size)
    n_docs = 3
    cu = torch.tensor([0] + [T * (i + 1) // n_docs for i in range(n_docs)])
    ids = torch.repeat_interleave(torch.arange(n_docs), cu[1:] - cu[:-1]).view(1, T).expand(spec.batch, T)
    kwargs: dict[str, Any] = {"document_ids": ids}
    if spec.mask == "document_window":
        kwargs["window"] = spec.window
    elif spec.mask == "document_prefix":
        kwargs["prefix_lengths"] = torch.full((spec.batch, n_docs), 8)
    elif spec.mask == "document_bidirectional":
        kwargs["causal"] = False
    return make_document_mask(**kwargs)


def compile_spec(spec: KernelSpec) -> None:
    """Run FA4 on fake CUDA tensors for ``spec`` (the store, if installed, keeps the kernels)."""
    import torch
    from flash_attn.cute import interface as fi
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[spec.dtype]
    mask = build_mask(spec)
    hkv = spec.heads_kv or spec.heads
    dv = spec.head_dim_v or spec.head_dim
    causal = spec.mask == "causal"
    softcap = spec.softcap or 0.0  # FA4's convention: 0 for none
    if mask is not None:
        mask = mask.for_head_dim(spec.head_dim)
    # quiet: CUTLASS notes FA4's aux tensors on every compile, torch the fake data pointers.
    with record_spec(spec.to_dict()), FakeTensorMode(), quiet_library_warnings():
        _absorb_fake_data_ptr_warning()
        B, T = spec.batch, spec.seqlen if mask is None else mask.seqlen
        q = torch.empty(B, T, spec.heads, spec.head_dim, dtype=dtype, device="cuda")
        k = torch.empty(B, T, hkv, spec.head_dim, dtype=dtype, device="cuda")
        v = torch.empty(B, T, hkv, dv, dtype=dtype, device="cuda")
        if spec.varlen and mask is not None and mask.varlen is not None:
            fake_varlen_call(mask, q, k, v, backward=spec.backward, softcap=softcap)
            return
        mk = _fake_mask(mask) if mask is not None else {}
        bwd_sparse = mk.pop("block_sparse_tensors_bwd", None)
        out, lse, *_ = fi._flash_attn_fwd(q, k, v, causal=causal, softcap=softcap, return_lse=True, **mk)
        if spec.backward:
            mk["block_sparse_tensors"] = bwd_sparse
            fi._flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, causal=causal, softcap=softcap, **mk)


def counted(store: Any, fold: Callable[[], None], label: str, run: Callable[[], None]) -> dict[str, Any]:
    """Run one warm item; what the store's counters say it did (compiles, kernels present,
    compile seconds), its wall time and its error, if any (one bad item must not stop the others)."""
    fold()
    before = store.counters.counts()
    t0 = time.perf_counter()
    err = None
    try:
        run()
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        log.warning("fa4cache warm: %s failed: %s", label, err)
    fold()
    c = store.counters.counts()
    unsaved = int(c.get("publish_errors", 0) - before.get("publish_errors", 0))
    if unsaved and err is None:
        # Compiled but not stored (a full disk, say): the item did not do its job.
        err = f"{unsaved} kernel(s) compiled but not saved to the store (the warning above says why)"
    return {
        "compiles": int(c["compiles"] - before["compiles"]),
        "present": int(c["disk_hits"] - before["disk_hits"] + c["memory_hits"] - before["memory_hits"]),
        "seconds": time.perf_counter() - t0,
        "error": err,
        "compile_seconds": float(c["compile_seconds"] - before["compile_seconds"]),
    }
