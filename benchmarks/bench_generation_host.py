"""Where an eager decode step spends host time: transformers' ``generate`` with a dynamic
cache, on the CPU, FA4's kernel stubbed out (it is the GPU's work; its Python interface is
timed apart, below), against "sdpa" on the same model.

Eager decoding on a GPU is bound by the host (each aten op is a kernel launch and a few
microseconds of dispatch; the model's work per step is small), so the count of aten ops
per layer and the Python time around them are what the GPU's step time follows. Counted
here, per decode step:

* aten ops inside the attention call of one layer (``TorchDispatchMode``: views included,
  as each costs dispatch time; the FA4 launch itself is one stubbed call, not counted);
* host syncs (``aten._local_scalar_dense``: ``.item()``, ``.tolist()``, ``int(t)``);
* µs of host time per layer in the attention call (kernel stubbed), median of steps;
* ms per step of the whole model forward (tiny model: the host's share of the step).

FA4's own Python interface (``_flash_attn_fwd`` up to the compiled kernel's call) is
timed with its kernel call skipped, for the decode call's arguments.

    python benchmarks/bench_generation_host.py [--batch 8] [--prompt 128] [--steps 32]

Writes generation_host_cpu.{md,json} under $FA4CACHE_RESULTS (or benchmarks/results).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

from common import save, table


def _config(layers: int, head_dim: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=4, head_dim=head_dim, max_position_embeddings=8192,
    )  # fmt: skip


def _stub_fa4() -> None:
    """FA4's kernel out of the measurement: the KV-cache and varlen calls return their
    output buffer (preallocated by the adapter, or allocated here once per call)."""
    from fa4cache.decode import launch
    from fa4cache.ops import varlen_calls

    def fwd(q: Any, k: Any, v: Any, out: Any = None, **kw: Any) -> Any:
        return out if out is not None else q.new_zeros(*q.shape[:-1], v.shape[-1])

    launch._fa4_forward = fwd

    def vforward(q: Any, k: Any, v: Any, calls: Any, scale: Any, softcap: float = 0.0) -> Any:
        import torch

        return q.new_zeros(*q.shape[:-1], v.shape[-1]), torch.zeros(q.shape[1], q.shape[0])

    varlen_calls.forward = vforward


# Ops that launch no kernel on a GPU (views, aliases, allocations from the caching allocator):
# they cost dispatch time only.
NO_KERNEL = {"view", "_unsafe_view", "reshape", "transpose", "unsqueeze", "squeeze", "expand", "slice",
             "select", "permute", "t", "alias", "detach", "as_strided", "empty", "new_empty", "empty_like",
             "empty_strided", "unbind", "split"}  # fmt: skip


def _kernels(counts: Any) -> int:
    return sum(v for k, v in counts.items() if k not in NO_KERNEL)


def _custom_impls() -> dict[str, Any]:
    from fa4cache.decode import kv_cache, paged

    return {
        "fa4cache.kv_cache_attention": kv_cache.forward,
        "fa4cache.varlen_kv_attention": paged.varlen_forward,
    }


class _Count:
    """Aten ops seen while active (a ``TorchDispatchMode``)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counts: Counter[str] = Counter()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                impl = _custom_impls().get(str(func.overloadpacket))
                if impl is not None:  # fa4cache's ops: what runs inside them is counted
                    with Mode():
                        return impl(*args, **(kwargs or {}))
                counts[str(func.overloadpacket.__name__)] += 1
                return func(*args, **(kwargs or {}))

        self.counts, self.mode = counts, Mode


def _wrap_attention(impl: str, per_layer: list[float], counting: dict[str, Any]) -> Any:
    """The attention function of ``impl`` timed (and its ops counted when asked)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    fn = ALL_ATTENTION_FUNCTIONS[impl]

    def timed(*a: Any, **kw: Any) -> Any:
        c = counting.get("c")
        if c is not None:
            with c.mode():
                return fn(*a, **kw)
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        per_layer.append(time.perf_counter() - t0)
        return out

    return timed


def profile(impl: str, cfg: Any, batch: int, prompt: int, steps: int) -> dict[str, Any]:
    """Decode steps of ``impl`` over a dynamic cache after a left-padded prompt."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl).eval()
    per_layer: list[float] = []
    counting: dict[str, Any] = {}
    real = ALL_ATTENTION_FUNCTIONS[impl]
    ALL_ATTENTION_FUNCTIONS[impl] = _wrap_attention(impl, per_layer, counting)
    try:
        ids = torch.randint(1, cfg.vocab_size, (batch, prompt))
        mask = torch.ones(batch, prompt, dtype=torch.long)
        mask[1:, : prompt // 4] = 0  # left padding
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache)
            step_ms, tok = [], ids[:, -1:]
            layer_ops: Counter[str] = Counter()
            step_ops: Counter[str] = Counter()
            for t in range(steps + 1):
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                pos = mask.sum(-1, keepdim=True) - 1
                kw = {"input_ids": tok, "attention_mask": mask, "position_ids": pos, "cache": cache}
                if t == steps:  # the last step counted, not timed
                    c = _Count()
                    counting["c"] = c
                    model(**kw)
                    layer_ops = c.counts
                    counting.clear()
                    c2 = _Count()
                    with c2.mode():
                        model(**kw)  # (a second step with the same tokens: only counted)
                    step_ops = c2.counts
                    break
                per_layer.clear() if t == 0 else None
                t0 = time.perf_counter()
                model(**kw)
                step_ms.append((time.perf_counter() - t0) * 1e3)
    finally:
        ALL_ATTENTION_FUNCTIONS[impl] = real
    layers = cfg.num_hidden_layers
    return {
        "impl": impl,
        "attention_ops_per_layer": sum(layer_ops.values()) / layers,
        "attention_kernel_ops_per_layer": _kernels(layer_ops) / layers,
        "model_kernel_ops_per_step": _kernels(step_ops),
        "attention_ops": dict(sorted(layer_ops.items(), key=lambda kv: -kv[1])),
        "host_syncs_per_step": step_ops.get("_local_scalar_dense", 0),
        "model_ops_per_step": sum(step_ops.values()),
        "attention_us_per_layer": statistics.median(per_layer) * 1e6,
        "step_ms": statistics.median(step_ms[1:] or step_ms),
    }


def fa4_interface_us(batch: int, heads_kv: int, group: int, head_dim: int, keys: int) -> float | None:
    """µs of FA4's ``_flash_attn_fwd`` host code for one decode call (the compiled kernel's
    call skipped: FA4's fake mode, with a cache that has every key); None if FA4 is absent."""
    try:
        import torch
        from flash_attn.cute import interface as fi
    except ImportError:
        return None

    class AllHit(dict):  # type: ignore[type-arg]
        def __contains__(self, k: Any) -> bool:
            return True

    saved = {n: getattr(fi, n) for n in ("is_fake_mode", "get_num_sms_for_selection", "_validate_tensor")}
    cache = fi._flash_attn_fwd.compile_cache
    fwd = fi._flash_attn_fwd  # with fa4cache's wrappers: FA4 reads its cache through this name
    try:
        fi.is_fake_mode = lambda: True
        fi.get_num_sms_for_selection = lambda *a, **k: 132
        fi._validate_tensor = lambda *a, **k: None
        fwd.compile_cache = AllHit()
        n = batch * heads_kv
        q = torch.zeros(n, 1, group, head_dim, dtype=torch.bfloat16)
        k = torch.zeros(n * keys, 1, head_dim, dtype=torch.bfloat16)
        cu = torch.arange(0, (n + 1) * keys, keys, dtype=torch.int32)
        used = torch.full((n,), keys, dtype=torch.int32)
        out = torch.empty_like(q)
        kw = {"cu_seqlens_k": cu, "seqused_k": used, "max_seqlen_q": 1, "max_seqlen_k": keys, "softmax_scale": 0.1,
              "causal": True, "softcap": 0.0, "out": out, "_arch": 90}  # fmt: skip
        times = []
        for _ in range(300):
            t0 = time.perf_counter()
            fwd(q, k, k, **kw)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[50:]) * 1e6
    finally:
        for n, f in saved.items():
            setattr(fi, n, f)
        fwd.compile_cache = cache


def replayed_call_us(
    batch: int, head_dim: int, keys: int, calls: int = 3000, repeats: int = 9
) -> float | None:
    """µs of host time of the adapter's whole decode call (transformers' attention function for
    "fa4cache", one layer, not the first of its kind) with FA4's launch replayed from its
    plan and the planned kernel a no-op: the minimum over ``repeats`` loops of ``calls``
    calls. What a decode layer costs the host besides the kernel launch itself; None if FA4 is
    absent. (On the CPU the plan is made for CPU tensors, which a GPU process never plans.)"""
    try:
        import torch
        from flash_attn.cute import interface as fi
    except ImportError:
        return None
    from fa4cache.adapters.transformers import attention

    from fa4cache.decode import launch, plan
    from fa4cache.decode import launch_plans as lp

    key = ("bench_generation_host", "no-op kernel")

    class OneKernel:  # a compile cache holding one kernel that does nothing
        cache = {key: lambda *args: None}

        def __contains__(self, k: Any) -> bool:
            return k in self.cache

        def __getitem__(self, k: Any) -> Any:
            return self.cache[k]

    def fa4(
        q: Any, k: Any, v: Any, out: Any = None, cu_seqlens_k: Any = None, seqused_k: Any = None, **kw: Any
    ) -> Any:
        # FA4 as the plan observes it: one kernel call with the call's own tensors
        fi._flash_attn_fwd.compile_cache[key](q, k, v, out, cu_seqlens_k, seqused_k, kw["softmax_scale"])
        return out

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer_idx, self.is_causal = 3, True
            self.config = SimpleNamespace(layer_types=["full_attention"] * 8)

    saved = (fi._flash_attn_fwd.compile_cache, launch._fa4_forward, launch._plain, list(lp._verified))
    fi._flash_attn_fwd.compile_cache = OneKernel()
    launch._fa4_forward = fa4
    launch._plain = lambda tensors: True
    lp._verified[:] = [True]
    lp.clear()
    try:
        hq, hkv = 16, 4
        q = torch.randn(batch, hq, 1, head_dim, dtype=torch.bfloat16)
        k = torch.randn(batch, hkv, keys, head_dim, dtype=torch.bfloat16)
        v = torch.randn_like(k)  # not k again: a call whose k is its v is planned by FA4 every time
        mask = torch.ones(batch, keys, dtype=torch.long)
        layer, scale = Layer(), head_dim**-0.5
        with torch.no_grad():
            for _ in range(100):
                attention.attention_forward(layer, q, k, v, mask, scaling=scale)
            if not any(type(x) is plan.Plan for x in lp._plans.values()):
                return None  # no replay: not what is measured here
            best = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(calls):
                    attention.attention_forward(layer, q, k, v, mask, scaling=scale)
                best.append((time.perf_counter() - t0) / calls * 1e6)
        return min(best)
    finally:
        fi._flash_attn_fwd.compile_cache, launch._fa4_forward, launch._plain = saved[:3]
        lp._verified[:] = saved[3]
        lp.clear()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--label", default="", help="a name for this code version (the table's column)")
    p.add_argument("--name", default="generation_host_cpu")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from fa4cache.adapters import transformers as fht

    fht.register()
    _stub_fa4()
    cfg = _config(a.layers, a.head_dim)
    runs = [profile(impl, cfg, a.batch, a.prompt, a.steps) for impl in ("fa4cache", "sdpa")]
    fa4_us = fa4_interface_us(a.batch, 4, 4, a.head_dim, a.prompt + a.steps)
    replay_us = replayed_call_us(a.batch, a.head_dim, a.prompt + a.steps)
    data = {"args": vars(a), "runs": runs, "fa4_interface_us": fa4_us, "replayed_call_us": replay_us}
    rows = [
        [r["impl"], f"{r['attention_ops_per_layer']:.1f}", f"{r['attention_kernel_ops_per_layer']:.1f}",
         r["host_syncs_per_step"], f"{r['attention_us_per_layer']:.0f}", r["model_ops_per_step"],
         r["model_kernel_ops_per_step"], f"{r['step_ms']:.2f}",
         ", ".join(f"{k} {v // a.layers}" for k, v in list(r["attention_ops"].items())[:8])]
        for r in runs
    ]  # fmt: skip
    save(
        a.name,
        f"Host time of an eager decode step (CPU, FA4's kernel stubbed), Llama GQA 16/4 d {a.head_dim}, "
        f"{a.layers} layers, batch {a.batch}, prompt {a.prompt} (left padded), dynamic cache{a.label and ', ' + a.label}",
        [
            (
                "Per decode step",
                table(
                    [
                        "attn_implementation",
                        "aten ops / layer (attention)",
                        "of which kernels",
                        "host syncs / step",
                        "µs / layer (attention, host)",
                        "aten ops / step (model)",
                        "of which kernels",
                        "ms / step (model, CPU)",
                        "attention ops per layer",
                    ],
                    rows,
                ),  # fmt: skip
            ),
            (
                "FA4's Python interface for one decode call (kernel call skipped)",
                "n/a (FA4 not installed)" if fa4_us is None else f"{fa4_us:.0f} µs",
            ),
            (
                "The adapter's whole decode call, FA4's launch replayed, the kernel a no-op "
                "(min of 9 loops of 3,000 calls)",
                "n/a (FA4 not installed)" if replay_us is None else f"{replay_us:.1f} µs",
            ),
        ],
        data,
    )
    return data


if __name__ == "__main__":
    os.environ.setdefault("FA4CACHE_COMPILE_AHEAD", "0")
    main()
