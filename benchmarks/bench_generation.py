"""Decoding through transformers' ``generate`` on one GPU: ``attn_implementation="fa4cache"``
(KV-cache steps on FA4) against "sdpa" and transformers' own "flash_attention_4" (with
``register()``'s fix), and ``generate_batch`` (continuous batching, paged cache) for
"fa4cache" against its "sdpa" run.

Model: Qwen3-4B's shape (hidden 2560, 32 query / 8 KV heads of 128, MLP 9728, vocab
151936) with random bf16 weights and ``--layers`` layers (default 6 of its 36, to keep the
run within ``--budget``, 130 s plus ~20 s of imports; per-layer attention work is the same, the title says how many).
Prompts: ``--prompts`` (32 and 64) of 128-512 random tokens, left padded; ``--new`` (512)
new tokens each, greedy, no early stop.

* generate: decode tokens/s = prompts x (new - 1) / (time of generate(new) - time of
  generate(1)): the prefill is taken out.
* generate_batch: tokens/s over its whole run (prefill included: continuous batching
  interleaves it), after a short warm-up run (which also sizes the run to the budget).
* Compiles: FA4 kernels compiled during each timed run (``fa4cache.stats()`` counters),
  after a warm-up generate (or generate_batch) of 8 (16) tokens at the first prompt count:
  0 is the target.

Runs go in order of importance (32 prompts first), each timed run within an equal share of
what is left of ``--budget`` seconds after its warm-up: ``generate`` stops at that share
(``max_time``), ``generate_batch`` runs as many new tokens as a short run says fit; the
table's ``new`` column says what each run reached (raise ``--budget`` for 512 everywhere). A failing implementation is a row with its error; the others still run. The
table (markdown + json) is rewritten after every run, so a run cut short keeps what it
measured.

    python benchmarks/bench_generation.py [--layers 6] [--prompts 32 64] [--new 512] [--budget 130]

Writes generation_h200.{md,json} under $FA4CACHE_RESULTS (or $OUT/results, or
benchmarks/results). ``--device cpu --shape tiny`` runs the same code paths on the CPU
(tests/integration/test_bench_generation.py, with the FA4 stand-in).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from common import save, table

ANCHOR = "sdpa"
WARM_NEW = 8  # generate's warm-up tokens
PROBE_NEW = 16  # generate_batch's warm-up (and sizing) tokens


class Stop(Exception):
    """SIGTERM (``timeout`` in gpu_run.sh): stop measuring, write what was measured."""


def _config(shape: str, layers: int) -> Any:
    from transformers import Qwen3Config

    if shape == "tiny":  # the CPU check of the code paths
        dims = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
        dims |= {"num_key_value_heads": 2, "head_dim": 16}
    else:
        dims = {
            "vocab_size": 151936,
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_attention_heads": 32,
        }
        dims |= {"num_key_value_heads": 8, "head_dim": 128}
    return Qwen3Config(
        **dims, num_hidden_layers=layers, max_position_embeddings=40960, tie_word_embeddings=True
    )


def _compiles(store: Any) -> int:
    from fa4cache.adapters.fa4.patch import fold_all_hits

    fold_all_hits()
    store.counters.flush()
    return int(store.counters.values["compiles"])


def _prompts(n: int, vocab: int, seed: int, lo: int, hi: int, device: str) -> tuple[Any, Any]:
    import torch

    rng = random.Random(seed)
    lens = [rng.randint(lo, hi) for _ in range(n)]
    T = max(lens)
    ids = torch.randint(1, vocab, (n, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(n, T, dtype=torch.long)
    for b, n_b in enumerate(lens):
        mask[b, T - n_b :] = 1
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Any) -> tuple[float, Any]:
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def _generate_rate(model: Any, ids: Any, mask: Any, new: int, max_time: float) -> dict[str, Any]:
    kw = {"attention_mask": mask, "do_sample": False, "pad_token_id": 0}
    first, _ = _timed(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw))
    full, out = _timed(
        lambda: model.generate(ids, max_new_tokens=new, min_new_tokens=new, max_time=max_time, **kw)
    )
    done = int(out.shape[1] - ids.shape[1])
    return {
        "new": done,
        "seconds": full,
        "prefill_seconds": first,
        "decode_tokens_per_s": ids.shape[0] * (done - 1) / max(full - first, 1e-9),
    }


def _batch_prompts(ids: Any, mask: Any) -> list[list[int]]:
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def _generate_batch(model: Any, prompts: list[list[int]], new: int) -> tuple[float, Any]:
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=-1
    )
    return _timed(lambda: model.generate_batch(inputs=prompts, generation_config=cfg, progress_bar=False))


def _generate_batch_rate(
    model: Any, prompts: list[list[int]], new: int, seconds_left: float
) -> dict[str, Any]:
    """``generate_batch`` of ``new`` tokens, or fewer where a short run says that ``new`` would
    not fit in ``seconds_left`` (the short run's time per token includes its prefill: an
    overestimate, so the run ends early rather than late)."""
    probe, _ = _generate_batch(model, prompts, min(PROBE_NEW, new))
    fit = int(0.8 * max(seconds_left - probe, 0.0) / probe * min(PROBE_NEW, new))
    new = min(new, max(PROBE_NEW, fit))
    seconds, out = _generate_batch(model, prompts, new)
    done = [len(r.generated_tokens) for r in out.values()]
    return {
        "new": new,
        "seconds": seconds,
        "probe_seconds": probe,
        "requests_done": len(done),
        "decode_tokens_per_s": sum(done) / seconds,
    }


def _error(e: BaseException) -> str:
    import torch

    if isinstance(e, torch.OutOfMemoryError):
        return "out of memory"
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--prompts", type=int, nargs="+", default=[32, 64])
    p.add_argument("--prompt-len", type=int, nargs=2, default=[128, 512], metavar=("MIN", "MAX"))
    p.add_argument("--new", type=int, default=512)
    p.add_argument("--impls", nargs="*", default=["fa4cache", "sdpa", "flash_attention_4"])
    p.add_argument(
        "--batch-impls", nargs="*", default=["fa4cache", "sdpa"], help="generate_batch runs (paged cache)"
    )
    p.add_argument("--budget", type=float, default=130.0, help="seconds for all runs (imports excluded)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", choices=["qwen3-4b", "tiny"], default="qwen3-4b")
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
    cfg = _config(a.shape, a.layers)
    t_start = time.perf_counter()
    deadline = t_start + a.budget
    data: dict[str, Any] = {"args": vars(a), "layers": a.layers, "new_tokens": a.new, "runs": []}
    plan = [(api, impl, n) for n in a.prompts for api, impls in (("generate", a.impls), ("generate_batch", a.batch_impls)) for impl in impls]  # fmt: skip
    models: dict[tuple[str, str], Any] = {}
    warmed: set[tuple[str, str]] = set()

    def build(api: str, impl: str) -> Any:
        if (api, impl) not in models:
            torch.manual_seed(0)  # the same weights for every implementation
            with torch.device(a.device):  # random init on the GPU: seconds, not a minute on the CPU
                m = AutoModelForCausalLM.from_config(
                    copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16
                )
            models[api, impl] = m.eval()
            data["parameters"] = sum(x.numel() for x in m.parameters())
        return models[api, impl]

    def write(final: bool = False) -> None:
        sink = contextlib.nullcontext() if final else contextlib.redirect_stdout(io.StringIO())
        with sink:
            _save(a, data)

    def on_term(*_: Any) -> None:
        raise Stop("SIGTERM")

    old_term = signal.signal(signal.SIGTERM, on_term)
    stopped = False
    try:
        for i, (api, impl, n) in enumerate(plan):
            left = deadline - time.perf_counter()
            share = left / (len(plan) - i)
            row: dict[str, Any] = {"api": api, "impl": impl, "prompts": n}
            if share < 2.0:
                data["runs"].append({**row, "error": f"skipped: past --budget {a.budget:.0f} s"})
                continue
            t_run = time.perf_counter()
            try:
                with torch.no_grad():
                    model = build(api, impl)
                    ids, mask = _prompts(n, cfg.vocab_size, n, *a.prompt_len, a.device)
                    if (api, impl) not in warmed:  # every kernel of the first prompt count
                        w_ids, w_mask = _prompts(a.prompts[0], cfg.vocab_size, 0, *a.prompt_len, a.device)
                        if api == "generate":
                            kw = {"max_new_tokens": WARM_NEW, "min_new_tokens": WARM_NEW, "pad_token_id": 0}
                            model.generate(w_ids, attention_mask=w_mask, do_sample=False, **kw)
                        else:
                            _generate_batch(model, _batch_prompts(w_ids, w_mask), min(PROBE_NEW, a.new))
                        warmed.add((api, impl))
                    before = _compiles(store)
                    # The share of what the warm-ups (FA4 compiles) left, over the runs to go.
                    left_here = (deadline - time.perf_counter()) / (len(plan) - i)
                    if api == "generate":
                        r = _generate_rate(model, ids, mask, a.new, max(left_here, 1.0))
                    else:
                        r = _generate_batch_rate(model, _batch_prompts(ids, mask), a.new, left_here)
                    row |= r | {"compiles": _compiles(store) - before}
            except Stop:
                data["runs"].append({**row, "error": "stopped: SIGTERM (time limit)"})
                raise
            except Exception as e:  # a row, not the end of the run: the others still run
                row["error"] = _error(e)
                if api == "generate_batch" or "out of memory" in row["error"]:
                    models.pop((api, impl), None)  # a failed paged run may hold its cache
            row["wall_seconds"] = time.perf_counter() - t_run
            data["runs"].append(row)
            if api == "generate_batch":
                models.pop((api, impl), None)  # its paged cache is the model's: free it now
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            what = row.get("error") or "{:.0f} tok/s".format(row["decode_tokens_per_s"])
            print(f"{api} {impl} {n} prompts: {what} ({time.perf_counter() - t_start:.0f} s)", flush=True)
            write()
    except Stop:
        stopped = True
    finally:
        signal.signal(signal.SIGTERM, old_term)
        data["total_seconds"] = time.perf_counter() - t_start
        write(final=True)
    if stopped:
        # generate_batch's generation thread may still run: leave now, as `timeout` expects.
        os._exit(124)
    return data


def _save(a: Any, data: dict[str, Any]) -> None:
    """The table from ``data["runs"]`` (ratios over the anchor's run of the same API and
    prompt count), markdown and json."""
    runs = data["runs"]
    anchors = {
        (r["api"], r["prompts"]): r for r in runs if r["impl"] == ANCHOR and "decode_tokens_per_s" in r
    }
    rows = []
    for r in runs:
        if "error" in r:
            rows.append([r["api"], r["prompts"], r["impl"], "", "", "", "", "", r["error"]])
            continue
        base = anchors.get((r["api"], r["prompts"]))
        ratio = ""
        if base is not None:
            ratio = f"{r['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}x"
            ratio += "" if base["new"] == r["new"] else " (new differs)"
        rows.append(
            [r["api"], r["prompts"], r["impl"], r["new"], f"{r['seconds']:.1f}", f"{r['decode_tokens_per_s']:.0f}",
             ratio, r["compiles"], ""]
        )  # fmt: skip
    fa4 = [r["compiles"] for r in runs if r["impl"] == "fa4cache" and "compiles" in r]
    data["fa4cache_compiles_in_timed_runs"] = sum(fa4) if fa4 else None
    params = data.get("parameters", 0) / 1e9
    shape = "Qwen3-4B shape" if a.shape == "qwen3-4b" else "tiny Qwen3 shape (CPU check)"
    save(
        a.name,
        f"Decoding through transformers, {shape} with {a.layers} of 36 layers ({params:.2f}B parameters), "
        f"random bf16 weights, up to {a.new} new tokens, budget {a.budget:.0f} s",
        [
            (
                "Decode tokens/s (generate: prefill time taken out; generate_batch: whole run; "
                f"x: over {ANCHOR} for the same API and prompts; new: tokens each prompt reached "
                "within the run's share of the budget)",
                table(
                    [
                        "API",
                        "prompts",
                        "attn_implementation",
                        "new",
                        "seconds",
                        "decode tok/s",
                        f"vs {ANCHOR}",
                        "FA4 compiles",
                        "error",
                    ],
                    rows,
                ),  # fmt: skip
            ),
            (
                "FA4 kernels compiled during fa4cache's timed runs, after its warm-up (target 0)",
                "n/a (no fa4cache run finished)" if not fa4 else str(sum(fa4)),
            ),
        ],
        data,
    )


if __name__ == "__main__":
    main()
