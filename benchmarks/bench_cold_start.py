"""Cold start in parallel (issue 26): warm -j per kernel, compile-ahead, many cold processes.

CPU (2 cores here; no GPU):

    python benchmarks/bench_cold_start.py --cpu [--rounds 3]

  ``fa4cache warm --hf-config <Qwen3-8B shape>`` (one spec, 5 kernels) with ``-j 2`` vs
  ``-j 1``, fresh store per run, runs alternating; whole commands timed (interpreter start
  and imports included). Writes results/cold_start_cpu.{md,json}.

GPU (the H200 host, 16 cores; under ~4 minutes):

    python benchmarks/bench_cold_start.py --gpu [--parts imports,warm,step,procs,model]

  * the phases: seconds to import torch and FA4 in a fresh process, and each kernel's
    compile seconds (from the store's records of the -j 1 warm);

  * warm --hf-config Qwen3-8B and Gemma 2 9B shapes: ``-j`` default vs ``-j 1``;
  * cold first step of a document-mask forward+backward (T=8192, 16 heads, d=128, bf16,
    fa4cache.attention), imports excluded, each in a fresh process and store: FA4's own
    cache (no install), fa4cache without compile-ahead (today), fa4cache with it;
  * 4 and 8 cold processes on one node (LOCAL_WORLD_SIZE set as torchrun would): wall of
    the first step (from a common start to the last process done), compile-ahead off vs
    on, and compiles vs distinct kernels in the store;
  * cold first training step of bench_transformers' Qwen3-style model at 16K tokens,
    compile-ahead off (today) vs on (the model's kernel set starts compiling at load).
  Each cold step also gets a timeline: when each kernel compiled, from the store's records.
  Writes $OUT/cold_start_h200.{md,json} (OUT defaults to benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import save, table

HERE = Path(__file__).resolve().parent
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "sliding_window": None,
}  # fmt: skip
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584,
    "num_attention_heads": 16, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
    "sliding_window": 4096, "attn_logit_softcapping": 50.0,
}  # fmt: skip
MODELS = (("Qwen3-8B", QWEN3_8B), ("Gemma 2 9B", GEMMA2_9B))
TITLE = "Cold start in parallel on the H200 host"
PROC_HEAD = [
    "processes", "compile-ahead", "first step wall s", "compiles", "distinct kernels", "compiled ahead",
    "lock waits",
]  # fmt: skip
CPU_ENV = {"FLASH_ATTENTION_ARCH": "sm_90", "CUTE_DSL_ARCH": "sm_90a", "FLASH_ATTENTION_NUM_SMS": "132"}


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def warm_run(
    tmp: Path, cfg: dict[str, Any], jobs: int | None, env: dict[str, str], kernels: list[str] | None = None
) -> dict[str, Any]:
    """One ``fa4cache warm --hf-config`` on a fresh store: wall seconds and kernels compiled."""
    d = Path(tempfile.mkdtemp(dir=tmp))
    (d / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "fa4cache", "--cache-dir", str(d / "store"), "warm", "--hf-config", str(d)]
    if jobs is not None:
        cmd += ["-j", str(jobs)]
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the command and every process it waited for (its workers)
    cpu_s = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr[-3000:]}")
    last = p.stdout.strip().splitlines()[-1]  # "N specs, K kernels compiled, F failed, S s"
    kernels_n = int(last.split(",")[1].split()[0])
    st = json.loads(
        subprocess.run(
            [sys.executable, "-m", "fa4cache", "--cache-dir", str(d / "store"), "stats", "--json"],
            env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(), check=True,
        ).stdout
    )  # fmt: skip
    if kernels is not None:
        kernels.append(kernel_table(d / "store"))
    return {
        "wall_s": wall, "cpu_s": cpu_s, "load": load0, "kernels": kernels_n, "entries": st["entries"],
        "compiles": st["compiles"],
    }  # fmt: skip


def cpu(args: argparse.Namespace) -> None:
    env = env_with(**CPU_ENV, FA4CACHE_COMPILE_AHEAD="0")
    runs: dict[str, list[dict[str, Any]]] = {"-j 1": [], "-j 2": []}
    with tempfile.TemporaryDirectory() as t:
        for r in range(args.rounds):
            order = ["-j 1", "-j 2"] if r % 2 == 0 else ["-j 2", "-j 1"]
            for name in order:
                res = warm_run(Path(t), QWEN3_8B, int(name[-1]), env)
                runs[name].append(res)
                print(f"round {r}: warm {name}: {res}", flush=True)
    med = {n: statistics.median(x["wall_s"] for x in v) for n, v in runs.items()}
    ratio = med["-j 2"] / med["-j 1"]
    rows = [
        [
            n, len(v), med[n], " ".join(f"{x['wall_s']:.1f}" for x in v),
            statistics.median(x["cpu_s"] for x in v), " ".join(f"{x['load']:.1f}" for x in v),
            v[0]["kernels"], v[0]["compiles"],
        ]
        for n, v in runs.items()
    ]  # fmt: skip
    rows.append(["-j 2 / -j 1", "", ratio, "target <= 0.75", "", "", "", ""])
    body = table(
        ["warm --hf-config Qwen3-8B", "runs", "median wall s", "each run s", "median CPU s",
         "load avg at start", "kernels", "store compiles"],
        rows,
    )  # fmt: skip
    save(
        "cold_start_cpu",
        "Cold start on the CPU: warm -j per kernel",
        [
            (
                f"warm of one spec, 5 kernels ({os.cpu_count()} CPU cores, whole command, fresh store per run)",
                body + "\n\nThe machine is shared (load average at each start above); runs alternate so "
                "that load falls on both alike. -j 2 forks its second worker after the one "
                "import of torch and FA4; it shortens the wall only where the second core is free for this job.",
            )
        ],
        {"runs": runs, "median_s": med, "ratio": ratio, "loadavg": os.getloadavg()},
    )


# ------------------------------------------------------------------ GPU


def store_spans(store: Path, t0: float) -> list[list[Any]]:
    """Each kernel the store holds: kind, and its compile's start and end in seconds after
    ``t0`` (wall clock), from the entry's record (published at ``created``, after
    ``compile_seconds``)."""
    from fa4cache.store import Store

    st = Store.at(store)
    rows = []
    for e in st.layout.iter_entries():
        side = st.read_sidecar(e.ref)
        if side is None or side.compile_seconds is None:
            continue
        end = side.created - t0
        rows.append([side.kind, end - side.compile_seconds, end, side.compile_seconds])
    return sorted(rows, key=lambda r: r[1])


def import_seconds(code: str, env: dict[str, str]) -> float:
    """Wall seconds of ``code`` (imports) in a fresh interpreter, measured inside it."""
    prog = f"import time; t = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    p = subprocess.run(
        [sys.executable, "-c", prog], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir()
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    return float(p.stdout.strip().splitlines()[-1])


def imports_part(sections: list[tuple[str, str]], data: dict[str, Any]) -> None:
    rows = []
    hidden = env_with(CUDA_VISIBLE_DEVICES="", **CPU_ENV)
    cases = [
        ("torch", "import torch", env_with()),
        ("torch + FA4 (GPU visible)", "import torch\nimport flash_attn.cute.interface", env_with()),
        ("torch + FA4 (GPU hidden: warm, compile server)", "import torch\nimport flash_attn.cute.interface", hidden),
    ]  # fmt: skip
    for label, code, env in cases:
        runs = [import_seconds(code, env) for _ in range(2)]
        rows.append([label, min(runs), " ".join(f"{x:.2f}" for x in runs)])
        data.setdefault("imports", {})[label] = runs
        print(f"import {label}: {runs}", flush=True)
    sections.append(
        (
            "Imports in a fresh process (2 runs; the first may read from disk)",
            table(["imports", "best s", "runs s"], rows),
        )
    )


def kernel_table(store: Path) -> str:
    rows = [[kind, secs] for kind, _, _, secs in store_spans(store, 0.0)]
    return table(["kernel", "compile s (miss to publish)"], rows)


def step_procs(
    tmp: Path, n: int, mode: str, path: str, T: int, ahead: bool, tag: str
) -> tuple[list[dict[str, Any]], float, dict[str, Any] | None]:
    """``n`` cold processes on one fresh store: their results, the wall from the common start
    to the last first step done, and the store's stats (fa4cache)."""
    d = tmp / tag
    d.mkdir()
    go = d / "go"
    extra = {"WAIT_FILE": str(go), "LOCAL_WORLD_SIZE": str(n)}
    if mode == "fa4cache":
        extra |= {"FA4CACHE_DIR": str(d / "store"), "FA4CACHE_COMPILE_AHEAD": "1" if ahead else "0"}
    else:
        extra |= {
            "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
            "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(d / "fa4own"),
        }
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_cold_step.py"), mode, path, str(T)],
            env=env_with(**extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
        )  # fmt: skip
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"step process failed: {line}{p.stderr.read()[-3000:] if p.stderr else ''}")
    time.sleep(1.0)  # what a training process does between its imports and its first step
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=400)
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"step process failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    wall = max(r["first_s"] for r in results)  # each timed from its own sight of the go file
    st = None
    if mode == "fa4cache":
        st = json.loads(
            subprocess.run(
                [sys.executable, "-m", "fa4cache", "--cache-dir", str(d / "store"), "stats", "--json"],
                env=env_with(), capture_output=True, text=True, cwd=tempfile.gettempdir(), check=True,
            ).stdout
        )  # fmt: skip
    return results, wall, st


def model_part(
    tmp: Path, args: argparse.Namespace, sections: list[tuple[str, str]], data: dict[str, Any]
) -> None:
    """bench_transformers' model, first step on a fresh store: compile-ahead off, then on."""
    rows, res = [], {}
    for ahead in (False, True):
        d = tmp / f"model-{ahead}"
        d.mkdir()
        env = env_with(FA4CACHE_DIR=str(d / "store"), FA4CACHE_COMPILE_AHEAD="1" if ahead else "0")
        p = subprocess.run(
            [sys.executable, str(HERE / "_cold_model_step.py"), str(args.model_tokens), str(args.model_layers)],
            env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=300,
        )  # fmt: skip
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"model step failed ({p.returncode}):\n{p.stderr[-3000:]}")
        r = json.loads(lines[-1][len("RESULT ") :])
        res[ahead] = r
        c = r["counters"]
        rows.append(
            ["on" if ahead else "off (today)", r["first_s"], r["head_start_s"], c["compiles"],
             c.get("ahead_compiles", 0), r["second_s"]]
        )  # fmt: skip
        print(f"model step ahead={ahead}: {r['first_s']:.2f} s", flush=True)
    rows.append(["on / off", res[True]["first_s"] / res[False]["first_s"], "", "", "target <= 0.5", ""])
    data["model step"] = {str(k): v for k, v in res.items()}
    sections.append(
        (
            f"Cold first training step through transformers (bench_transformers' Qwen3-style model, "
            f"{args.model_layers} layers, {args.model_tokens} tokens, fresh store; timed once the model is "
            "on the GPU)",
            table(
                [
                    "compile-ahead",
                    "first step s",
                    "model built to first step s",
                    "compiles",
                    "compiled ahead",
                    "second step s",
                ],
                rows,
            ),  # fmt: skip
        )
    )


def gpu(args: argparse.Namespace) -> None:
    parts = set(args.parts.split(","))
    sections: list[tuple[str, str]] = []
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if "imports" in parts:
            imports_part(sections, data)
            save("cold_start_h200", TITLE, sections, data)
        if "warm" in parts:
            rows = []
            env = env_with(FA4CACHE_COMPILE_AHEAD="0")
            per_kernel: list[str] = []
            for name, cfg in MODELS:
                one = warm_run(tmp, cfg, 1, env, per_kernel)
                auto = warm_run(tmp, cfg, None, env)
                rows.append(
                    [name, one["kernels"], one["wall_s"], auto["wall_s"], auto["wall_s"] / one["wall_s"]]
                )
                data[f"warm {name}"] = {"j1": one, "default": auto}
                print(f"warm {name}: {data[f'warm {name}']}", flush=True)
            sections.append(
                (
                    "warm --hf-config, whole command, fresh store (-j default: min(cores, kernels))",
                    table(["model", "kernels", "-j 1 s", "-j default s", "ratio (target <= 0.4)"], rows),
                )
            )
            for (name, _), kt in zip(MODELS, per_kernel):
                sections.append((f"{name}: each kernel's compile, warm -j 1", kt))
            save("cold_start_h200", TITLE, sections, data)  # what a timeout leaves is still written
        if "step" in parts:
            rows = []
            runs = {}
            timelines: list[tuple[str, str]] = []
            cases = [
                ("FA4's own cache (no install)", "fa4own", False),
                ("fa4cache, compile-ahead on", "fa4cache", True),
            ]
            if args.today:
                cases.insert(1, ("fa4cache, compile-ahead off (today)", "fa4cache", False))
            for label, mode, ahead in cases:
                tag = f"step-{mode}-{ahead}"
                res, wall, st = step_procs(tmp, 1, mode, "varlen", args.seqlen, ahead, tag)
                runs[label] = {"result": res[0], "stats": st}
                if mode == "fa4cache":
                    spans = store_spans(tmp / tag / "store", res[0]["go_at"])
                    runs[label]["timeline"] = spans
                    timelines.append(
                        (
                            f"Timeline of the cold step, {label} (s after the step's start; first "
                            f"step {res[0]['first_s']:.2f} s, {res[0]['compiles']} compiled in the "
                            f"process in {res[0]['compile_s']:.2f} s)",
                            table(["kernel", "start s", "end s", "compile s"], spans),
                        )
                    )
                print(f"cold step {label}: {res[0]}", flush=True)
            own = runs["FA4's own cache (no install)"]["result"]["first_s"]
            for label, r in runs.items():
                st = r["stats"] or {}
                rows.append(
                    [label, r["result"]["first_s"], r["result"]["first_s"] / own, r["result"]["compiles"],
                     st.get("ahead_compiles", "-"), st.get("ahead_saved_seconds", "-"), r["result"]["second_s"]]
                )  # fmt: skip
            data["cold step"] = runs
            sections.append(
                (
                    f"Cold first step: document mask fwd+bwd, T={args.seqlen}, 16 heads, d=128, bf16 "
                    "(fa4cache.attention), imports excluded",
                    table(
                        [
                            "",
                            "first step s",
                            "vs FA4's own (target <= 0.5)",
                            "compiles in process",
                            "compiled ahead",
                            "ahead s saved",
                            "second step s",
                        ],
                        rows,
                    ),  # fmt: skip
                )
            )
            sections.extend(timelines)
            save("cold_start_h200", TITLE, sections, data)
        if "model" in parts:
            model_part(tmp, args, sections, data)
            save("cold_start_h200", TITLE, sections, data)
        if "procs" in parts:
            rows = []
            for n in (4, 8):
                walls = {}
                for ahead in (False, True):
                    res, wall, st = step_procs(
                        tmp, n, "fa4cache", "varlen", args.seqlen, ahead, f"p{n}-{ahead}"
                    )
                    assert st is not None
                    walls[ahead] = wall
                    data[f"{n} procs ahead={ahead}"] = {"results": res, "wall_s": wall, "stats": st}
                    rows.append(
                        [n, "on" if ahead else "off (today)", wall, st["compiles"], st["entries"],
                         st["ahead_compiles"], st["lock_waits"]]
                    )  # fmt: skip
                    print(
                        f"{n} procs ahead={ahead}: wall {wall:.2f} s, stats compiles {st['compiles']}",
                        flush=True,
                    )
                rows.append([n, "on / off", walls[True] / walls[False], "", "", "target <= 0.5", ""])
                save(
                    "cold_start_h200",
                    TITLE,
                    [*sections, ("(partial) cold processes", table(PROC_HEAD, rows))],
                    data,
                )
            sections.append(
                (
                    f"Cold processes on one node, first step (T={args.seqlen}), wall = slowest process",
                    table(
                        [
                            "processes",
                            "compile-ahead",
                            "first step wall s",
                            "compiles",
                            "distinct kernels",
                            "compiled ahead",
                            "lock waits",
                        ],
                        rows,
                    ),  # fmt: skip
                )
            )
    save("cold_start_h200", TITLE, sections, data)


def main() -> None:
    p = argparse.ArgumentParser()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--cpu", action="store_true")
    g.add_argument("--gpu", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parts", default="imports,warm,step,model,procs")
    p.add_argument("--model-tokens", type=int, default=16384)
    p.add_argument("--model-layers", type=int, default=24)
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--today", action="store_true", help="also one cold process without compile-ahead")
    a = p.parse_args()
    if a.gpu and "OUT" in os.environ:
        os.environ.setdefault("FA4CACHE_RESULTS", os.environ["OUT"])
    cpu(a) if a.cpu else gpu(a)


if __name__ == "__main__":
    main()
