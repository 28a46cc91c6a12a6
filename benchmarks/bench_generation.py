"""Decoding through transformers on one GPU, like with like: ``attn_implementation="fa4cache"``
against "sdpa" on the same path (and transformers' own "flash_attention_4" on eager
``generate`` where it runs), in steady state.

Paths: eager ``generate`` (dynamic cache, transformers' default), ``generate`` with a static
cache and transformers' own compile (CUDA graphs), and ``generate_batch`` (continuous
batching). Models, random bf16 weights: ``llama-d64`` (Llama, GQA 16/4, head dim 64, 8
layers), ``llama-d128`` (GQA 32/8, head dim 128, 8 layers), ``qwen3-4b`` (Qwen3-4B's shape,
``--qwen-layers`` of its 36 layers). Grid: batch B ∈ {1, 8, 32, 64}, prompt ∈ {128, 2048}
(left padded by up to an eighth), 256 new tokens.

Like with like:

* every implementation is warmed by ``--warm`` (2) full untimed runs of the same job
  before any timed run (sdpa's first calls were seen 10x slower than its steady state);
* the same number of new tokens for each: ``min_new_tokens == max_new_tokens``, no eos;
* ``--repeats`` (3) rounds of timed runs, one per implementation, in alternating order
  (AB, BA, AB, ...): tok/s is each implementation's median, the ratio the median of the
  rounds' own ratios with their range beside it (a host that drifts between rounds moves
  both runs of a round alike; the range is the run's noise);
* Python's collector runs before each timed run and is off during it;
* a per-step profile beside the table, from inside ``generate`` (eager path): the attention
  call's host µs per layer, kernel launches and host syncs per step, kernels per layer, GPU
  busy ms per step (torch.profiler), beside the timed runs' ms per step;
* FA4 compiles during the timed runs (``fa4cache.stats()``; target 0) and torch.compile
  frames compiled then; CUDA graph replays per timed run (continuous batching replays its
  step graphs where they are on: transformers 5.2x's default for fa4cache, not for sdpa);
* teacher-forced logits against sdpa's own full forward, beside sdpa's own incremental
  error (its noise), per model.

Jobs run in priority order (``--jobs``, default: the issue's key shapes first) within
``--budget`` seconds; a job that would start past it is a row saying so. Each finished row
is written at once (markdown + json), so a run cut short keeps what it measured; SIGTERM
(``timeout``) writes the table and exits 124.

    python benchmarks/bench_generation.py [--budget 180] [--jobs generate:llama-d64:32:2048 ...]

Writes generation_h200.{md,json} under $FA4CACHE_RESULTS (or $OUT/results, or
benchmarks/results). ``--device cpu --shape tiny`` runs the same code on the CPU
(tests/benchmarks/test_bench_generation.py, with the FA4 stand-in).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from common import save, table

ANCHOR = "sdpa"
PATHS = ("generate", "static_compiled", "generate_batch")
# The key shapes first: eager generate where fa4cache was 0.55x, then the compiled
# path at a long prompt, then generate_batch, then the rest of the grid.
PRIORITY = [
    "generate:llama-d64:32:2048",
    "generate:llama-d64:32:128",
    "static_compiled:llama-d64:32:2048",
    "generate_batch:llama-d64:32:128",
    "generate:qwen3-4b:32:2048",
    "generate:llama-d64:1:128",
    "generate:llama-d64:64:2048",
    "generate:llama-d128:32:2048",
    "static_compiled:llama-d64:32:128",
    "generate:llama-d64:8:2048",
    "generate:llama-d64:1:2048",
]
GRID_B = (1, 8, 32, 64)
GRID_PROMPT = (128, 2048)


class Stop(Exception):
    """SIGTERM (``timeout`` in gpu_run.sh): stop measuring, write what was measured."""


def config(shape: str, qwen_layers: int) -> Any:
    from transformers import LlamaConfig, Qwen3Config

    if shape == "tiny":  # the CPU check of the code paths
        return LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
        )  # fmt: skip
    if shape == "llama-d64":
        return LlamaConfig(
            vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
            num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=8192,
        )  # fmt: skip
    if shape == "llama-d128":
        return LlamaConfig(
            vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=8,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
        )  # fmt: skip
    if shape == "qwen3-4b":
        return Qwen3Config(
            vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=qwen_layers,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
            tie_word_embeddings=True,
        )  # fmt: skip
    raise ValueError(f"unknown shape {shape!r}")


def parse_job(spec: str) -> tuple[str, str, int, int]:
    path, shape, b, p = spec.split(":")
    if path not in PATHS:
        raise ValueError(f"job {spec!r}: path must be one of {PATHS}")
    return path, shape, int(b), int(p)


def all_jobs(first: list[str], shapes: list[str]) -> list[tuple[str, str, int, int]]:
    """``first`` in order, then the rest of the grid (each path, shape, B, prompt once)."""
    jobs = [parse_job(s) for s in first]
    for path in PATHS:
        for shape in shapes:
            for p in GRID_PROMPT:
                for b in GRID_B:
                    if (path, shape, b, p) not in jobs:
                        jobs.append((path, shape, b, p))
    return jobs


def prompts(batch: int, length: int, vocab: int, seed: int, device: str) -> tuple[Any, Any]:
    """``batch`` random prompts of ``length`` tokens, rows after the first left padded by up to
    an eighth (so every path sees padding)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    pads = torch.randint(0, max(1, length // 8), (batch,), generator=g)
    for b in range(1, batch):
        mask[b, : int(pads[b])] = 0
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def cache_kwarg() -> str:
    """The model's name for its cache argument: ``cache`` from transformers 5.2x (where
    ``past_key_values`` is deprecated), ``past_key_values`` before (5.17)."""
    import inspect

    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Any) -> tuple[float, Any]:
    """``fn()``'s wall seconds, the GPU drained on both sides. Python's collector runs first
    and not during the run: an eager decode is bound by the host, and a collection landing in
    one implementation's run and not the other's is noise the size of the difference measured."""
    sync()
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn()
        sync()
        return time.perf_counter() - t0, out
    finally:
        if was_on:
            gc.enable()


def gen_kwargs(new: int) -> dict[str, Any]:
    """Exactly ``new`` tokens, greedy, no early stop."""
    return {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False, "eos_token_id": None,
            "pad_token_id": 0}  # fmt: skip


def round_ratios(results: dict[str, dict[str, Any]]) -> list[float]:
    """fa4cache's speed over sdpa's in each round of the timed runs (the two run back to back,
    in alternating order): a host that drifts between rounds moves both sides of a round alike,
    so the median of these is the ratio reported, and their range is the run's noise."""
    ours, base = results.get("fa4cache", {}).get("times", []), results.get(ANCHOR, {}).get("times", [])
    return [b / o for o, b in zip(ours, base)]


def run_once(path: str, model: Any, ids: Any, mask: Any, new: int) -> tuple[float, int]:
    """One ``path`` run of ``new`` tokens per prompt: (seconds, tokens generated)."""
    if path == "generate_batch":
        from transformers import GenerationConfig

        cfg = GenerationConfig(**{**gen_kwargs(new), "eos_token_id": -1})
        rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
        kw: dict[str, Any] = {}
        if ids.device.type == "cpu":
            # transformers sizes the paged cache from the device's free memory: on a CPU host that
            # is its RAM (9 GB for the tiny model of the CPU test). A GPU run keeps its sizing.
            from transformers import ContinuousBatchingConfig

            kw["continuous_batching_config"] = ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=256)
        secs, out = timed(
            lambda: model.generate_batch(inputs=rows, generation_config=cfg, progress_bar=False, **kw)
        )
        return secs, sum(min(len(r.generated_tokens), new) for r in out.values())
    kw = {"attention_mask": mask, **gen_kwargs(new)}
    if path == "static_compiled":
        kw["cache_implementation"] = "static"
    secs, out = timed(lambda: model.generate(ids, **kw))
    return secs, int(out.shape[0] * (out.shape[1] - ids.shape[1]))


@contextlib.contextmanager
def graph_replays() -> Any:
    """Count CUDA graph replays meanwhile (continuous batching on transformers 5.2x replays
    its step graphs for implementations that need no mask): yields a one-item list."""
    import torch

    n = [0]
    cls = torch.cuda.CUDAGraph
    real = cls.replay

    def replay(self: Any) -> Any:
        n[0] += 1
        return real(self)

    cls.replay = replay  # type: ignore[method-assign]
    try:
        yield n
    finally:
        cls.replay = real  # type: ignore[method-assign]


SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def timed_attention(impl: str) -> tuple[list[float], Any]:
    """Time every call of ``impl``'s registered attention function (host seconds, no sync):
    (the list they go in, a function that unwraps it again)."""
    from transformers import AttentionInterface

    registry = AttentionInterface._global_mapping
    fn = registry[impl]
    times: list[float] = []

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        r = fn(*a, **k)
        times.append(time.perf_counter() - t0)
        return r

    registry[impl] = timed
    return times, lambda: registry.__setitem__(impl, fn)


def step_profile(model: Any, impl: str, ids: Any, mask: Any, new: int) -> dict[str, float]:
    """Inside steady-state ``generate`` calls of ``new`` tokens (eager, dynamic cache), per
    decode step: the attention call's host µs per layer (its function timed, the prefill's
    calls left out), and from torch.profiler over a whole call: kernel launches, kernels per
    layer, host syncs, GPU busy ms and wall ms."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    layers = model.config.num_hidden_layers
    times, undo = timed_attention(impl)
    try:
        run_once("generate", model, ids, mask, new)
    finally:
        undo()
    attn = times[layers:]
    cuda = torch.cuda.is_available() and ids.is_cuda
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    sync()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        run_once("generate", model, ids, mask, new)
        wall = time.perf_counter() - t0
    launches = syncs = kernels = 0
    gpu_us = 0.0
    for e in prof.key_averages():
        if e.key in LAUNCH_NAMES:
            launches += e.count
        elif e.key in SYNC_NAMES:
            syncs += e.count
    if cuda:
        for e in prof.events():
            name = e.name.lower()
            if (
                e.device_type == torch.autograd.DeviceType.CUDA
                and "memcpy" not in name
                and "memset" not in name
            ):
                kernels += 1
                gpu_us += e.device_time
    return {
        "attention_host_us_per_layer": statistics.median(attn) * 1e6 if attn else float("nan"),
        "launches_per_step": launches / new, "kernels_per_layer": kernels / new / layers,
        "syncs_per_step": syncs / new, "gpu_busy_ms_per_step": gpu_us / new / 1e3, "wall_ms_per_step": wall / new * 1e3,
    }  # fmt: skip


def logits_error(models: dict[str, Any], ids: Any, mask: Any, steps: int = 8) -> dict[str, float]:
    """Max |logit error| of each implementation's teacher-forced decode (dynamic cache)
    against sdpa's full forward over the same tokens; sdpa's own incremental error is the
    noise it is to be compared with."""
    import torch
    from transformers import DynamicCache

    follow = torch.randint(1, 100, (ids.shape[0], steps), device=ids.device)
    full_ids = torch.cat([ids, follow], 1)
    full_mask = torch.cat([mask, torch.ones_like(follow)], 1)
    with torch.no_grad():
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        want = models[ANCHOR](input_ids=full_ids, attention_mask=full_mask, position_ids=pos).logits[
            :, -steps:
        ]
        errs = {}
        for impl, m in models.items():
            cache = DynamicCache(config=m.config)
            am = mask
            p = (am.cumsum(-1) - 1).clamp(min=0)
            m(input_ids=ids, attention_mask=am, position_ids=p, **{cache_kwarg(): cache})
            got = []
            for t in range(steps):
                am = torch.cat([am, torch.ones_like(am[:, :1])], 1)
                p = am.sum(-1, keepdim=True) - 1
                got.append(m(input_ids=follow[:, t : t + 1], attention_mask=am, position_ids=p,
                             **{cache_kwarg(): cache}).logits)  # fmt: skip
            # Step t feeds follow[t]: its logits are the full forward's at that token's position.
            errs[impl] = float((torch.cat(got, 1).float() - want.float()).abs().max())
    return errs


def compiles(store: Any) -> int:
    from fa4cache.adapters.patch import fold_all_hits

    fold_all_hits()
    store.counters.flush()
    return int(store.counters.values["compiles"])


def dynamo_frames() -> int:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return 0


def error_text(e: BaseException) -> str:
    import torch

    if isinstance(e, torch.OutOfMemoryError):
        return "out of memory"
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=180.0, help="seconds for all jobs (imports excluded)")
    p.add_argument("--jobs", nargs="*", default=PRIORITY, help="PATH:SHAPE:B:PROMPT, first in this order")
    p.add_argument("--grid", action=argparse.BooleanOptionalAction, default=True,
                   help="after --jobs, the rest of the grid")  # fmt: skip
    p.add_argument("--shapes", nargs="*", default=["llama-d64", "llama-d128", "qwen3-4b"])
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--warm", type=int, default=2, help="untimed full runs per implementation and job")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per implementation (median)")
    p.add_argument("--impls", nargs="*", default=["fa4cache", "sdpa", "flash_attention_4"])
    p.add_argument("--qwen-layers", type=int, default=4)
    p.add_argument("--profile-new", type=int, default=32,
                   help="new tokens of the per-step profile's runs (eager generate jobs; 0: none)")  # fmt: skip
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", choices=["tiny"], default=None, help="every job on this shape (CPU check)")
    p.add_argument("--name", default="generation_h200", help="results file name")
    a = p.parse_args(argv)
    if "FA4CACHE_RESULTS" not in os.environ and os.environ.get("OUT"):
        os.environ["FA4CACHE_RESULTS"] = str(Path(os.environ["OUT"]) / "results")

    import torch
    from fa4cache.adapters import transformers as fht
    from transformers import AutoModelForCausalLM

    import fa4cache

    fht.register()
    store = fa4cache.install()
    t_start = time.perf_counter()
    deadline = t_start + a.budget
    jobs = all_jobs(a.jobs, a.shapes) if a.grid else [parse_job(s) for s in a.jobs]
    if a.shape:
        jobs = list(dict.fromkeys((j[0], a.shape, j[2], j[3]) for j in jobs))
    data: dict[str, Any] = {"args": vars(a), "rows": [], "logits": {}, "profile": {}}
    models: dict[tuple[str, str], Any] = {}

    def model(shape: str, impl: str) -> Any:
        if (shape, impl) not in models:
            for key in [k for k in models if k[0] != shape]:  # one shape's models at a time
                del models[key]
            gc.collect()
            torch.manual_seed(0)  # the same weights for every implementation
            with torch.device(a.device):
                m = AutoModelForCausalLM.from_config(
                    copy.deepcopy(config(shape, a.qwen_layers)),
                    attn_implementation=impl,
                    dtype=torch.bfloat16,
                )
            models[shape, impl] = m.eval()
        return models[shape, impl]

    def write(final: bool = False) -> None:
        sink = contextlib.nullcontext() if final else contextlib.redirect_stdout(io.StringIO())
        with sink:
            _save(a, data)

    def on_term(*_: Any) -> None:
        raise Stop("SIGTERM")

    old_term = signal.signal(signal.SIGTERM, on_term)
    stopped = False
    try:
        for path, shape, B, P in jobs:
            job = {"path": path, "shape": shape, "batch": B, "prompt": P, "new": a.new}
            impls = [i for i in a.impls if path == "generate" or i != "flash_attention_4"]
            if time.perf_counter() > deadline:
                data["rows"].append({**job, "error": f"skipped: past --budget {a.budget:.0f} s"})
                continue
            t_job = time.perf_counter()
            results: dict[str, dict[str, Any]] = {i: {"times": [], "tokens": None} for i in impls}
            try:
                with torch.no_grad():
                    vocab = config(shape, a.qwen_layers).vocab_size
                    ids, mask = prompts(B, P, vocab, seed=B * 7919 + P, device=a.device)
                    live = []
                    for impl in impls:
                        try:
                            m = model(shape, impl)
                            if path == "static_compiled":
                                torch._dynamo.reset()  # each implementation compiles its own graphs
                            for _ in range(a.warm):
                                run_once(path, m, ids, mask, a.new)
                            live.append(impl)
                        except Stop:
                            raise
                        except Exception as e:  # a row, not the end of the job
                            results[impl]["error"] = error_text(e)
                            models.pop((shape, impl), None)
                    if path == "static_compiled" and len(live) > 1:
                        # Graphs of the last warmed only would be live: warm again in timing order.
                        for impl in live[:-1]:
                            run_once(path, model(shape, impl), ids, mask, a.new)
                    before = {"fa4": compiles(store), "dynamo": dynamo_frames()}
                    for r in range(a.repeats):
                        order = live if r % 2 == 0 else live[::-1]
                        for impl in order:
                            if time.perf_counter() > deadline + 30 and results[impl]["times"]:
                                continue  # past the budget: what was timed stands
                            with graph_replays() as replays:
                                secs, tokens = run_once(path, model(shape, impl), ids, mask, a.new)
                            results[impl]["times"].append(secs)
                            results[impl]["tokens"] = tokens
                            results[impl]["graph_replays"] = replays[0]
                    job["fa4_compiles_timed"] = compiles(store) - before["fa4"]
                    job["round_ratios"] = round_ratios(results)
                    job["dynamo_graphs_timed"] = dynamo_frames() - before["dynamo"]
                    if path == "generate" and a.profile_new:
                        for impl in live:
                            data["profile"][f"{shape}:{impl}:{B}:{P}"] = {
                                "ms_per_step_timed": statistics.median(results[impl]["times"]) / a.new * 1e3,
                                **step_profile(model(shape, impl), impl, ids, mask, a.profile_new),
                            }
                    if ANCHOR in live and shape not in data["logits"] and len(live) > 1:
                        lb = min(B, 8)
                        data["logits"][shape] = logits_error(
                            {i: model(shape, i) for i in live},
                            ids[:lb, -min(P, 256) :],
                            mask[:lb, -min(P, 256) :],
                        )
            except Stop:
                job["error"] = "stopped: SIGTERM (time limit)"
                raise
            except Exception as e:
                job["error"] = error_text(e)
                if "out of memory" in job["error"]:
                    models.clear()
            finally:
                job["impls"] = {}
                for impl, r in results.items():
                    entry: dict[str, Any] = {k: v for k, v in r.items() if k != "times"}
                    if r["times"]:
                        med = statistics.median(r["times"])
                        entry |= {"runs": len(r["times"]), "seconds": med, "tokens_per_s": r["tokens"] / med}
                    job["impls"][impl] = entry
                job["wall_seconds"] = time.perf_counter() - t_job
                data["rows"].append(job)
                if path == "generate_batch":
                    for impl in impls:
                        models.pop((shape, impl), None)  # its paged cache is the model's: free it
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                write()
                rates = {i: round(e["tokens_per_s"]) for i, e in job["impls"].items() if "tokens_per_s" in e}
                print(f"{path} {shape} B={B} prompt={P}: {rates or job.get('error')} "
                      f"({time.perf_counter() - t_start:.0f} s)", flush=True)  # fmt: skip
    except Stop:
        stopped = True
    finally:
        signal.signal(signal.SIGTERM, old_term)
        data["total_seconds"] = time.perf_counter() - t_start
        write(final=True)
    if stopped:
        os._exit(124)  # generate_batch's thread may still run: leave now, as `timeout` expects
    return data


def _ratio(row: dict[str, Any], ours: float | None, base: float | None) -> str:
    """The median of the rounds' ratios, their range beside it (the tokens of both runs are the
    same, so a ratio of times is one of tokens/s)."""
    rounds = row.get("round_ratios") or []
    if rounds:
        med = statistics.median(rounds)
        return f"{med:.2f}x ({min(rounds):.2f}-{max(rounds):.2f})" if len(rounds) > 1 else f"{med:.2f}x"
    return f"{ours / base:.2f}x" if ours and base else "-"


def _save(a: Any, data: dict[str, Any]) -> None:
    rows = []
    for r in data["rows"]:
        head = [r["path"], r["shape"], r["batch"], r["prompt"], r["new"]]
        if "impls" not in r:
            rows.append([*head, "", "", "", "", "", "", r.get("error", "")])
            continue
        base = r["impls"].get(ANCHOR, {}).get("tokens_per_s")
        errs = "; ".join(f"{i}: {e['error']}" for i, e in r["impls"].items() if "error" in e)
        rate = {i: e.get("tokens_per_s") for i, e in r["impls"].items()}
        ours = rate.get("fa4cache")
        fa4 = rate.get("flash_attention_4")
        rows.append([
            *head,
            f"{ours:.0f}" if ours else "-",
            f"{base:.0f}" if base else "-",
            _ratio(r, ours, base),
            f"{fa4:.0f}" if fa4 else "-",
            r.get("fa4_compiles_timed", ""),
            "/".join(str(r["impls"].get(i, {}).get("graph_replays", "-")) for i in ("fa4cache", ANCHOR)),
            "; ".join(x for x in (errs, r.get("error", "")) if x),
        ])  # fmt: skip
    prof = [[k, *(round(x, 2) for x in v.values())] for k, v in data["profile"].items()]
    logit_rows = [
        [s, *(f"{e.get(i, float('nan')):.3f}" for i in ("fa4cache", ANCHOR, "flash_attention_4"))]
        for s, e in data["logits"].items()
    ]
    timed_compiles = [r.get("fa4_compiles_timed") for r in data["rows"] if "fa4_compiles_timed" in r]
    data["fa4cache_compiles_in_timed_runs"] = sum(timed_compiles) if timed_compiles else None
    save(
        a.name,
        f"Decoding through transformers in steady state (random bf16 weights; {a.warm} untimed runs per "
        f"implementation, then {a.repeats} rounds in alternating order, tok/s their median; exactly {a.new} new "
        "tokens; Python's collector run before each timed run and off during it)",
        [
            (
                "Tokens/s (whole run, prefill included; ratio over sdpa on the same path)",
                table(
                    [
                        "path",
                        "model",
                        "B",
                        "prompt",
                        "new",
                        "fa4cache tok/s",
                        "sdpa tok/s",
                        "fa4cache / sdpa (median of rounds; range)",
                        "flash_attention_4 tok/s",
                        "FA4 compiles (timed)",
                        "CUDA graph replays per run (fa4cache/sdpa)",
                        "error",
                    ],
                    rows,
                ),  # fmt: skip
            ),
            (
                f"Per decode step inside eager generate (dynamic cache; model:impl:B:prompt; the timed runs' "
                f"ms/step, then one run of {a.profile_new} tokens timed per attention call and one under "
                "torch.profiler)",
                table(
                    [
                        "run",
                        "ms/step (timed runs)",
                        "attention host µs/layer",
                        "launches/step",
                        "kernels/layer",
                        "syncs/step",
                        "GPU busy ms/step",
                        "wall ms/step (profiled)",
                    ],
                    prof,
                )
                if prof
                else "n/a",  # fmt: skip
            ),
            (
                "Teacher-forced logits: max |error| against sdpa's full forward (sdpa's own column is its noise)",
                table(["model", "fa4cache", "sdpa (noise)", "flash_attention_4"], logit_rows)
                if logit_rows
                else "n/a",
            ),
            (
                "FA4 kernels compiled during the timed runs (target 0)",
                "n/a (no run finished)" if not timed_compiles else str(sum(timed_compiles)),
            ),
        ],
        data,
    )


if __name__ == "__main__":
    main()
