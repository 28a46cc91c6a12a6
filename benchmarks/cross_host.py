"""A bundle made on a CPU machine serves a GPU host with zero compiles (issue 33's proof).

On the CPU machine, with the README's install::

    python benchmarks/cross_host.py config out/cross          # a small Llama-like config.json
    FA4CACHE_DIR=out/cross/store fa4cache warm --hf-config out/cross --generation
    FA4CACHE_DIR=out/cross/store fa4cache bundle export out/cross/cpu.fa4b

On the GPU host (benchmarks/gpu_run.sh PART=cross)::

    python benchmarks/cross_host.py serve out/cross/cpu.fa4b out/cross

``serve`` imports the bundle into an empty store, then runs ``generate`` (dynamic cache),
``generate_batch`` (continuous batching) and a training step of the same model with
``FA4CACHE_EXPECT_WARM=error``: any compile raises, naming the kernel and why it missed.
It prints and writes (``$FA4CACHE_RESULTS/cross_host.json``) what each phase compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIG = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


def write_config(out: Path) -> None:
    from transformers import LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    LlamaConfig(**CONFIG).save_pretrained(out)
    print(f"wrote {out / 'config.json'}")


def _compiles(store: Any) -> int:
    store.counters.flush()
    return int(store.counters.values["compiles"] + store.counters.values["memory_only_compiles"])


def serve(bundle: Path, config_dir: Path) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="fa4cache-cross-"))
    os.environ["FA4CACHE_DIR"] = str(root / "store")
    os.environ["FA4CACHE_EXPECT_WARM"] = "error"
    # From another directory: the source tree in the working directory would shadow the
    # installed package (whose fa4cache.adapters is mapped in).
    cli = {"capture_output": True, "text": True, "cwd": root}
    imp = subprocess.run([sys.executable, "-m", "fa4cache", "bundle", "import", str(bundle.resolve())], **cli)
    doctor = subprocess.run([sys.executable, "-m", "fa4cache", "doctor"], **cli)
    result: dict[str, Any] = {"import": (imp.stdout + imp.stderr).strip(), "import_rc": imp.returncode}
    result["doctor_toolchain"] = [ln for ln in doctor.stdout.splitlines() if "toolchain" in ln]
    import torch
    from fa4cache.adapters import transformers as fht
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    import fa4cache

    fht.register()
    store = fa4cache.install()
    cfg = AutoConfig.from_pretrained(config_dir)
    phases: dict[str, Any] = {}

    def phase(name: str, fn: Any) -> None:
        before, t0 = _compiles(store), time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
            phases[name] = {
                "compiles": _compiles(store) - before,
                "seconds": round(time.perf_counter() - t0, 2),
            }
        except Exception as e:  # a compile under FA4CACHE_EXPECT_WARM=error, or anything else
            phases[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        print(name, phases[name], flush=True)

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4cache", dtype=torch.bfloat16).cuda()
    ids = torch.randint(0, cfg.vocab_size, (4, 40), device="cuda")

    def generate() -> None:
        with torch.no_grad():
            model.eval().generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)

    def generate_batch() -> None:
        paged = (
            AutoModelForCausalLM.from_config(cfg, attn_implementation="paged|fa4cache", dtype=torch.bfloat16)
            .cuda()
            .eval()
        )
        gen = GenerationConfig(max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=-1)
        paged.generate_batch(
            inputs=[list(range(5, 5 + n)) for n in (7, 30, 12)], generation_config=gen, progress_bar=False
        )

    def train_step() -> None:
        model.train()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()

    phase("generate", generate)
    phase("generate_batch", generate_batch)
    phase("train_step", train_step)
    result["phases"] = phases
    result["total_compiles"] = _compiles(store)
    result["ok"] = all(p.get("compiles") == 0 for p in phases.values())
    res = os.environ.get("FA4CACHE_RESULTS")
    if res:
        Path(res, "cross_host.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config")
    c.add_argument("out", type=Path)
    s = sub.add_parser("serve")
    s.add_argument("bundle", type=Path)
    s.add_argument("config_dir", type=Path)
    a = p.parse_args()
    if a.cmd == "config":
        write_config(a.out)
    else:
        sys.exit(0 if serve(a.bundle, a.config_dir)["ok"] else 1)


if __name__ == "__main__":
    main()
