"""Cold start in parallel (issue 26): warm -j per kernel, compile-ahead, many cold processes.

CPU (2 cores here; no GPU):

    python benchmarks/bench_cold_start.py --cpu [--rounds 3]

  ``fa4cache warm --hf-config <Qwen3-8B shape>`` (one spec, 5 kernels) with ``-j 2`` vs
  ``-j 1``, fresh store per run, runs alternating; whole commands timed (interpreter start
  and imports included). Writes results/cold_start_cpu.{md,json}.

GPU (the H200 host, 16 cores; issue 53):

    python benchmarks/bench_cold_start.py --gpu [--parts step,procs,model,profile,contention,imports,fork]

  * step: one cold process's first step (T=6144, GQA 12/4, d=64, document mask, fwd+bwd through
    fa4cache.attention), FA4's own disk cache against fa4cache, alternating, median of
    ``--rounds``; the breakdown of the median step from every process's phases
    (benchmarks/phases/: imports, the compile server's import, lookups, trace, codegen,
    publish, waiting) and a timeline of each kernel; then a warm process on each store;
  * procs: ``--procs`` (8) cold processes on one host, FA4's own against fa4cache, alternating;
  * model: bench_transformers' packed Qwen3-shaped model (16 layers, d 128, 16K tokens), first
    training step on a fresh store against its slowest kernel's compile (warm -j 1, same run);
  * fork: the step's backward compiled in process (after the forward, and as the process's
    first trace), in one forked child alone, and in forked children at once (warm -j 1 / 2 / 4),
    alternating: where a child's compile loses time (also on the CPU: --cpu --parts fork);
  * profile: one process of each case (cold, the floor, warm) under cProfile, its top
    functions and raw stats (results/profiles/): where a step's time goes, function by function;
  * contention: K = 1, 2, 4 processes each compiling alone on its own store (the host's share);
  * imports: seconds to import torch and FA4 in a fresh process.
  Writes $OUT/cold_start_h200.{md,json} (OUT defaults to benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
        "compiles": st["compiles"], "store": str(d / "store"),
    }  # fmt: skip


def cpu(args: argparse.Namespace) -> None:
    env = env_with(**CPU_ENV, FA4CACHE_COMPILE_AHEAD="0")
    runs: dict[str, list[dict[str, Any]]] = {"-j 1": [], "-j 2": []}
    with tempfile.TemporaryDirectory() as t:
        for r, name in alternating(["-j 1", "-j 2"], args.rounds):
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


SHAPE_ENV = {"COLD_HEADS": "12", "COLD_KV_HEADS": "4", "COLD_D": "64"}  # issue 53's case: GQA 12/4, d 64
PHASES_DIR = HERE / "phases"  # sitecustomize.py: every process's trace / codegen / publish phases


def step_procs(
    tmp: Path,
    n: int,
    mode: str,
    path: str,
    T: int,
    ahead: bool,
    tag: str,
    *,
    reuse: bool = False,
    apart: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], float, dict[str, Any] | None, list[dict[str, Any]]]:
    """``n`` cold processes on one store (fresh unless ``reuse``: the store ``tag`` left by an
    earlier run; ``apart``: a store each, so that they share the host's cores and nothing
    else; ``env``: more environment for each): their results, the wall from the common start to the last first step done, the
    store's stats (fa4cache), and the phases every process of the run recorded."""
    d = tmp / tag
    d.mkdir(exist_ok=reuse)
    go = d / "go"
    go.unlink(missing_ok=True)
    phases = d / f"phases-{time.time_ns()}.jsonl"
    extra = {
        "WAIT_FILE": str(go), "LOCAL_WORLD_SIZE": str(n), "FA4CACHE_BENCH_PHASES": str(phases),
        "PYTHONPATH": os.pathsep.join(x for x in (str(PHASES_DIR), os.environ.get("PYTHONPATH", "")) if x),
        **SHAPE_ENV,
    }  # fmt: skip
    extra |= env or {}
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
            env=env_with(**{**extra, **({"FA4CACHE_DIR": str(d / f"store-{i}")} if apart else {})}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
        )  # fmt: skip
        for i in range(n)
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
        res = json.loads(lines[-1][len("RESULT ") :])
        res["pid"] = p.pid
        results.append(res)
    wall = max(r["first_s"] for r in results)  # each timed from its own sight of the go file
    st = None
    if mode == "fa4cache" and not apart:
        st = json.loads(
            subprocess.run(
                [sys.executable, "-m", "fa4cache", "--cache-dir", str(d / "store"), "stats", "--json"],
                env=env_with(), capture_output=True, text=True, cwd=tempfile.gettempdir(), check=True,
            ).stdout
        )  # fmt: skip
    return results, wall, st, read_phases(phases)


def read_phases(path: Path) -> list[dict[str, Any]]:
    """The phases every process of a run recorded (benchmarks/phases/), one JSON line each."""
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def codegen_of(trace: dict[str, Any], codegens: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The codegen phase that followed ``trace`` in its process (the same kernel's), if any."""
    return next(
        (x for x in codegens if x["pid"] == trace["pid"] and x["start"] >= trace["end"] - 0.001), None
    )


BREAKDOWN_HEAD = [
    "case", "first step s", "imports s", "server import s", "lookups and lock waits s", "trace s", "codegen s",
    "rest of compile s", "publish s", "waiting s", "kernels in process", "kernels elsewhere",
    "last kernel elsewhere done s",
]  # fmt: skip


def during_step(res: dict[str, Any], phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The phases, of every process of the run, that started during ``res``'s first step."""
    go, first = res["go_at"], res["first_s"]
    return [p for p in phases if go - 0.001 <= p["start"] <= go + first]


def breakdown(label: str, res: dict[str, Any], phases: list[dict[str, Any]]) -> tuple[list[Any], str]:
    """One process's cold first step in parts (its own phases during the step; what it did not
    spend in them it waited), and the timeline of every kernel compiled in the run."""
    go, first, me = res["go_at"], res["first_s"], res["pid"]
    during = during_step(res, phases)

    def own(phase: str) -> float:
        return sum(p["end"] - p["start"] for p in during if p["pid"] == me and p["phase"] == phase)

    compile_s, trace, codegen = own("compile"), own("trace"), own("codegen")
    lookups, publish = own("lookup"), own("publish")
    # cute.compile runs inside a lookup (a miss compiles in FA4's own code path, not under
    # our lookup), so the time spent in neither is waiting (on locks, on another's kernel)
    waiting = max(first - compile_s - lookups - publish, 0.0)
    server_import = [p["end"] - p["start"] for p in phases if p["phase"] == "server_import"]
    traces = sorted((p for p in phases if p["phase"] == "trace"), key=lambda p: p["start"])
    codegens = [p for p in phases if p["phase"] == "codegen"]
    rows, elsewhere_end = [], 0.0
    for t in traces:
        c = codegen_of(t, codegens)
        end = c["end"] if c else t["end"]
        where = "process" if t["pid"] == me else f"worker {t['pid']}"
        if t["pid"] != me:
            elsewhere_end = max(elsewhere_end, end - go)
        rows.append(
            [where, t.get("name", "?")[:48], t["start"] - go, t["end"] - t["start"],
             (c["end"] - c["start"]) if c else "-", end - go]
        )  # fmt: skip
    n_own = sum(1 for t in traces if t["pid"] == me)
    row = [
        label, first, res.get("import_s", "-"), max(server_import) if server_import else "-", lookups, trace,
        codegen, compile_s - trace - codegen, publish, waiting, n_own, len(traces) - n_own,
        elsewhere_end or "-",
    ]  # fmt: skip
    timeline = table(
        ["compiled in", "kernel (DSL function)", "trace start s", "trace s", "codegen s", "done s"], rows
    )
    return row, timeline


def process_timeline(res: dict[str, Any], phases: list[dict[str, Any]]) -> str:
    """Every phase every process of the run recorded during one first step, in order of start
    (seconds from the go): where the step's critical path goes."""
    go, me = res["go_at"], res["pid"]
    rows = []
    for p in sorted(during_step(res, phases), key=lambda p: p["start"]):
        who = "process" if p["pid"] == me else f"pid {p['pid']}"
        rows.append(
            [who, p["phase"], p.get("name", "")[:40], p["start"] - go, p["end"] - go, p["end"] - p["start"]]
        )
    return table(["who", "phase", "kernel", "start s", "end s", "s"], rows)


def alternating(cases: list[Any], rounds: int) -> Iterator[tuple[int, Any]]:
    """``(round, case)`` for ``rounds`` rounds of ``cases``, every other round in reverse order
    (a host that drifts during a run then weighs on every case alike)."""
    for r in range(rounds):
        for case in cases if r % 2 == 0 else cases[::-1]:
            yield r, case


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["result"]["first_s"])[len(runs) // 2]


def step_part(
    tmp: Path, args: argparse.Namespace, sections: list[tuple[str, str]], data: dict[str, Any]
) -> None:
    """One cold process, alternating FA4's own cache and fa4cache, median of ``--rounds``; then a
    warm process on each one's store (FA4's own disk cache, fa4cache's store)."""
    cases = [("FA4's own cache (no install)", "fa4own", False), ("fa4cache", "fa4cache", True)]
    if args.today:
        cases.append(("fa4cache, compile-ahead off", "fa4cache", False))
    runs: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in cases}
    for r, (label, mode, ahead) in alternating(cases, args.rounds):
        res, _, st, ph = step_procs(tmp, 1, mode, "varlen", args.seqlen, ahead, f"step-{mode}-{ahead}-{r}")
        runs[label].append({"result": res[0], "stats": st, "phases": ph, "tag": f"step-{mode}-{ahead}-{r}"})
        print(f"round {r} cold step {label}: {res[0]['first_s']:.2f} s", flush=True)
    # The floor: a cold process on a store holding every kernel of the step but the forward
    # (the copy a fa4cache run left, less its forward), so that the step compiles its forward
    # itself, with nothing beside it (no compile-ahead), and loads the rest: no design that
    # compiles the forward in the step does better.
    floor_label = "fa4cache, only the forward missing (the floor)"
    runs[floor_label] = []
    for r in range(args.rounds):
        tag = f"floor-{r}"
        (tmp / tag).mkdir()
        shutil.copytree(tmp / runs["fa4cache"][r]["tag"] / "store", tmp / tag / "store")
        for f in (tmp / tag / "store").glob("v2/*/fwd/*"):
            f.unlink()
        res, _, st, ph = step_procs(tmp, 1, "fa4cache", "varlen", args.seqlen, False, tag, reuse=True)
        runs[floor_label].append({"result": res[0], "stats": st, "phases": ph, "tag": tag})
        print(f"round {r} floor step: {res[0]['first_s']:.2f} s", flush=True)
    cases.append((floor_label, "floor", True))
    own = statistics.median(x["result"]["first_s"] for x in runs[cases[0][0]])
    rows, brk, timelines = [], [], []
    for label, mode, _ in cases:
        firsts = [x["result"]["first_s"] for x in runs[label]]
        med = statistics.median(firsts)
        rows.append([label, med, " ".join(f"{f:.2f}" for f in firsts), med / own])
        m = median_run(runs[label])
        row, tl = breakdown(label, m["result"], m["phases"])
        brk.append(row)
        timelines.append((f"Kernels compiled during the median cold step, {label}", tl))
        if mode == "fa4cache":
            timelines.append(
                (f"Every phase of the median cold step, {label}", process_timeline(m["result"], m["phases"]))
            )
    data["cold step"] = runs
    shape = f"T={args.seqlen}, GQA 12/4, d=64, bf16, document mask, fwd+bwd (fa4cache.attention)"
    sections.append(
        (
            f"One cold process, first step ({shape}; {args.rounds} rounds, alternating, imports excluded)",
            table(["", "median first step s", "rounds s", "vs FA4's own (target <= 0.4)"], rows),
        )
    )
    sections.append(("Breakdown of the median cold first step (seconds)", table(BREAKDOWN_HEAD, brk)))
    sections.extend(timelines)
    # A warm process: the same step on the store the cold runs left; also with the run-time
    # patch check off (FA4CACHE_PATCH_CHECK=0: the user's word that nothing is patched).
    unchecked = "fa4cache, FA4CACHE_PATCH_CHECK=0"
    warm_cases = [*cases[:2], (unchecked, "fa4cache", True)]
    wruns: dict[str, list[float]] = {c[0]: [] for c in warm_cases}
    servers: dict[str, int] = {c[0]: 0 for c in warm_cases}
    warm_fa4cache: list[dict[str, Any]] = []
    for r, (label, mode, ahead) in alternating(warm_cases, args.rounds):
        tag = runs["fa4cache" if label == unchecked else label][0]["tag"]
        env = {"FA4CACHE_PATCH_CHECK": "0"} if label == unchecked else None
        res, _, _, ph = step_procs(tmp, 1, mode, "varlen", args.seqlen, ahead, tag, reuse=True, env=env)
        wruns[label].append(res[0]["first_s"])
        servers[label] += sum(1 for p in ph if p["phase"] == "server_spawn")
        if label == "fa4cache":
            warm_fa4cache.append({"result": res[0], "phases": ph})
        print(
            f"round {r} warm step {label}: {res[0]['first_s']:.3f} s, compiles {res[0]['compiles']}, "
            f"phases recorded {len(ph)}, during the step {len(during_step(res[0], ph))}",
            flush=True,
        )
    wown = statistics.median(wruns[cases[0][0]])
    sections.append(
        (
            "A warm process, first step (the store the cold runs left; alternating)",
            table(
                [
                    "",
                    "median first step s",
                    "rounds s",
                    "vs FA4's own (target <= 1)",
                    "compile servers started",
                ],
                [
                    [
                        lb,
                        statistics.median(v),
                        " ".join(f"{x:.3f}" for x in v),
                        statistics.median(v) / wown,
                        servers[lb],
                    ]
                    for lb, v in wruns.items()
                ],
            ),  # fmt: skip
        )
    )
    m = median_run(warm_fa4cache)
    sections.append(
        ("Every phase of the median warm step, fa4cache", process_timeline(m["result"], m["phases"]))
    )
    data["warm step"] = {"runs": wruns, "servers": servers}


def profile_part(
    tmp: Path, args: argparse.Namespace, sections: list[tuple[str, str]], data: dict[str, Any]
) -> None:
    """Where a first step's time goes, function by function: one process of each case under
    cProfile (``$COLD_PROFILE``; its overhead inflates every time, so no ratio is taken from
    it): cold (fa4cache, FA4's own), the floor (only the forward missing), warm (fa4cache, with
    and without the patch check, FA4's own). Each profile's top functions by cumulative time
    go in the results, and the raw stats beside them (``profiles/``)."""
    import io
    import pstats

    out = Path(os.environ.get("FA4CACHE_RESULTS", HERE / "results")) / "profiles"
    out.mkdir(parents=True, exist_ok=True)

    def run(
        label: str, mode: str, ahead: bool, tag: str, reuse: bool, env: dict[str, str] | None = None
    ) -> None:
        prof = out / f"{tag}-{'warm' if reuse and tag != 'prof-floor' else 'cold'}-{len(sections)}.prof"
        res, _, _, ph = step_procs(
            tmp, 1, mode, "varlen", args.seqlen, ahead, tag, reuse=reuse,
            env={**(env or {}), "COLD_PROFILE": str(prof)},
        )  # fmt: skip
        buf = io.StringIO()
        pstats.Stats(str(prof), stream=buf).sort_stats("cumulative").print_stats(45)
        text = "\n".join(ln.rstrip() for ln in buf.getvalue().splitlines() if ln.strip())
        sections.append(
            (f"Profile: {label} (first step {res[0]['first_s']:.3f} s under cProfile)", f"```\n{text}\n```")
        )
        sections.append((f"Every phase: {label}", process_timeline(res[0], ph)))
        data.setdefault("profiles", {})[label] = res[0]["first_s"]
        print(f"profile {label}: {res[0]['first_s']:.3f} s", flush=True)

    run("cold, FA4's own", "fa4own", False, "prof-own", False)
    run("cold, fa4cache", "fa4cache", True, "prof-fa4cache", False)
    (tmp / "prof-floor").mkdir()
    shutil.copytree(tmp / "prof-fa4cache" / "store", tmp / "prof-floor" / "store")
    for f in (tmp / "prof-floor" / "store").glob("v2/*/fwd/*"):
        f.unlink()
    run("the floor (only the forward missing)", "fa4cache", False, "prof-floor", True)
    run("warm, FA4's own", "fa4own", False, "prof-own", True)
    run("warm, fa4cache", "fa4cache", True, "prof-fa4cache", True)
    run(
        "warm, fa4cache, FA4CACHE_PATCH_CHECK=0",
        "fa4cache",
        True,
        "prof-fa4cache",
        True,
        {"FA4CACHE_PATCH_CHECK": "0"},
    )


def procs_part(
    tmp: Path, args: argparse.Namespace, sections: list[tuple[str, str]], data: dict[str, Any]
) -> None:
    """``--procs`` cold processes on one host (LOCAL_WORLD_SIZE set as torchrun would), FA4's
    own cache against fa4cache, alternating, median of ``--rounds``."""
    n = args.procs
    cases = [("FA4's own cache", "fa4own"), ("fa4cache", "fa4cache")]
    out: dict[str, dict[str, list[float]]] = {c[0]: {"median": [], "wall": [], "compiles": []} for c in cases}
    for r, (label, mode) in alternating(cases, args.rounds):
        res, wall, st, _ = step_procs(tmp, n, mode, "varlen", args.seqlen, True, f"p{n}-{mode}-{r}")
        out[label]["median"].append(statistics.median(x["first_s"] for x in res))
        out[label]["wall"].append(wall)
        out[label]["compiles"].append(st["compiles"] if st else sum(x["compiles"] for x in res))
        print(
            f"round {r} {n} procs {label}: median {out[label]['median'][-1]:.2f} s wall {wall:.2f} s",
            flush=True,
        )
    own = {k: statistics.median(out[cases[0][0]][k]) for k in ("median", "wall")}
    rows = []
    for label, _ in cases:
        med = {k: statistics.median(out[label][k]) for k in ("median", "wall")}
        rows.append(
            [label, med["median"], med["median"] / own["median"], med["wall"], med["wall"] / own["wall"],
             " ".join(str(int(c)) for c in out[label]["compiles"])]
        )  # fmt: skip
    data[f"{n} procs"] = out
    sections.append(
        (
            f"{n} cold processes on one host, first step (T={args.seqlen}; {args.rounds} rounds, alternating)",
            table(
                [
                    "",
                    "median first step s",
                    "vs FA4's own (target <= 0.4)",
                    "wall s",
                    "vs FA4's own (target <= 0.6)",
                    "compiles per round",
                ],
                rows,
            ),  # fmt: skip
        )
    )


QWEN3_SMALL = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "head_dim": 128,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "sliding_window": None,
}  # fmt: skip  (bench_transformers' model, as warm --hf-config reads it)


def model_part(
    tmp: Path, args: argparse.Namespace, sections: list[tuple[str, str]], data: dict[str, Any]
) -> None:
    """bench_transformers' packed Qwen3-shaped model, first step on a fresh store, against the
    compile seconds of the slowest kernel of its set (``warm -j 1`` in the same run)."""
    rows, res = [], []
    for r in range(args.model_rounds):
        d = tmp / f"model-{r}"
        d.mkdir()
        env = env_with(FA4CACHE_DIR=str(d / "store"))
        p = subprocess.run(
            [sys.executable, str(HERE / "_cold_model_step.py"), str(args.model_tokens), str(args.model_layers)],
            env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=300,
        )  # fmt: skip
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"model step failed ({p.returncode}):\n{p.stderr[-3000:]}")
        res.append(json.loads(lines[-1][len("RESULT ") :]))
        print(f"model cold step {r}: {res[-1]['first_s']:.2f} s", flush=True)
    kernels: list[str] = []
    wr = warm_run(tmp, QWEN3_SMALL, 1, env_with(FA4CACHE_COMPILE_AHEAD="0"), kernels)
    slowest = max(secs for _, _, _, secs in store_spans(Path(wr["store"]), 0.0))
    first = statistics.median(x["first_s"] for x in res)
    for x in res:
        c = x["counters"]
        rows.append(
            [
                "cold first step",
                x["first_s"],
                x["head_start_s"],
                c["compiles"],
                c.get("ahead_compiles", 0),
                x["second_s"],
            ]
        )
    rows.append(["slowest kernel's compile (warm -j 1)", slowest, "", wr["kernels"], "", ""])
    rows.append(["median first step / slowest kernel", first / slowest, "target <= 1.3", "", "", ""])
    data["model step"] = {"runs": res, "slowest_kernel_s": slowest, "warm": wr}
    sections.append(
        (
            f"A cold packed Qwen3-shaped model (bench_transformers: {args.model_layers} layers, d 128, "
            f"{args.model_tokens} tokens), first training step on a fresh store",
            table(
                [
                    "",
                    "s",
                    "model built to first step s",
                    "compiles in process",
                    "compiled ahead",
                    "second step s",
                ],
                rows,
            )
            + "\n\nEach kernel of the set, warm -j 1:\n\n"
            + kernels[0],
        )
    )


def contention_part(
    tmp: Path, args: argparse.Namespace, sections: list[tuple[str, str]], data: dict[str, Any]
) -> None:
    """The host alone: K processes each compiling the same step on a store of its own
    (compile-ahead off), so that they share the cores and nothing else; each one's forward
    trace and codegen against K = 1."""
    rows = []
    for k in (1, 2, 4):
        res, _, _, ph = step_procs(
            tmp, k, "fa4cache", "varlen", args.seqlen, False, f"contend-{k}", apart=True
        )
        for r in res[:1]:
            mine = [p for p in ph if p["pid"] == r["pid"]]
            tr = next(p for p in mine if p["phase"] == "trace")
            cg = next(p for p in mine if p["phase"] == "codegen")
            rows.append([k, r["first_s"], tr["end"] - tr["start"], cg["end"] - cg["start"]])
        print(f"contention {k}: {rows[-1]}", flush=True)
    data["contention"] = rows
    sections.append(
        (
            "The host alone: K processes compile the same step at once, each on its own store",
            table(
                ["K", "first step s (one of them)", "its forward's trace s", "its forward's codegen s"], rows
            ),
        )
    )


FORK_SPEC = [
    "--head-dim",
    "64",
    "--heads",
    "12:4",
    "--mask",
    "document",
    "--varlen",
    "--backward",
    "--seqlen",
    "6144",
]


def _warm_phases(store: Path, jobs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """``fa4cache warm -j jobs`` of the step's kernel set into ``store``: per kernel kind that
    compiled, [trace s, codegen s, compile s (miss to publish)], from the phases and the store."""
    phases = store.parent / f"phases-{time.time_ns()}.jsonl"
    extra = {
        "FA4CACHE_BENCH_PHASES": str(phases),
        "PYTHONPATH": os.pathsep.join(x for x in (str(PHASES_DIR), env.get("PYTHONPATH", "")) if x),
    }
    cmd = [sys.executable, "-m", "fa4cache", "--cache-dir", str(store), "warm", *FORK_SPEC, "-j", str(jobs)]
    p = subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr[-3000:]}")
    recorded = read_phases(phases)
    traces = [r for r in recorded if r["phase"] == "trace"]
    codegens = [r for r in recorded if r["phase"] == "codegen"]
    out: dict[str, list[float]] = {}
    for t in traces:
        name = t.get("name", "?")
        kind = "bwd" if "bwd_sm" in name else "fwd" if "fwd_sm" in name else None
        if kind is None:
            continue
        c = codegen_of(t, codegens)
        out[kind] = [t["end"] - t["start"], (c["end"] - c["start"]) if c else float("nan")]
    for kind, _, _, secs in store_spans(store, 0.0):
        if kind in out:
            out[kind].append(secs)
    return out


def fork_part(
    tmp: Path,
    args: argparse.Namespace,
    sections: list[tuple[str, str]],
    data: dict[str, Any],
    env: dict[str, str] | None = None,
) -> None:
    """Why a compile server's child compiles a kernel slower than FA4's own process: the step's
    backward (and forward) compiled (a) in the warm process alone (``-j 1``, one after the
    other), (b) in that process as its first trace (``-j 1`` on a store holding every kernel
    but the backward), (c) in one forked child alone (``-j 2`` on that store), (d) in forked
    children all at once (``-j 4``), alternating, ``--rounds``. (b) against (c) tells the
    fork's cost from a process's first trace's."""
    import shutil

    env = env or env_with()
    base = tmp / "fork-base"
    base.mkdir()
    _warm_phases(base / "store", 1, env)  # the store (b) and (c) start from, less its backward
    cases = ["in process, one at a time (-j 1)", "in process, bwd its first trace (-j 1, only bwd missing)",
             "forked child, alone (-j 2, only bwd missing)", "forked children, all at once (-j 4)"]  # fmt: skip
    runs: dict[str, list[dict[str, list[float]]]] = {c: [] for c in cases}
    for r, case in alternating(cases, args.rounds):
        d = tmp / f"fork-{r}-{cases.index(case)}"
        d.mkdir()
        if "only bwd missing" in case:
            shutil.copytree(base / "store", d / "store")
            for f in (d / "store").glob("v2/*/bwd/*"):
                f.unlink()
            got = _warm_phases(d / "store", 1 if "-j 1" in case else 2, env)
        else:
            got = _warm_phases(d / "store", 1 if "-j 1" in case else 4, env)
        runs[case].append(got)
        print(f"fork {case}: {got}", flush=True)
    rows = []
    for case in cases:
        for kind in ("fwd", "bwd"):
            vals = [g[kind] for g in runs[case] if kind in g and len(g[kind]) == 3]
            if not vals:
                continue
            rows.append([case, kind, *(statistics.median(v[i] for v in vals) for i in range(3)),
                         " ".join(f"{v[2]:.2f}" for v in vals)])  # fmt: skip
    data["fork"] = runs
    sections.append(
        (
            "A kernel compiled in process, in a forked child alone, and in forked children at once "
            f"(the step's kernel set, warm; median of {args.rounds}, alternating)",
            table(["where", "kernel", "trace s", "codegen s", "compile s", "compile s, rounds"], rows),
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
        if "fork" in parts:
            fork_part(tmp, args, sections, data)
            save("cold_start_h200", TITLE, sections, data)
        if "contention" in parts:
            contention_part(tmp, args, sections, data)
            save("cold_start_h200", TITLE, sections, data)
        if "step" in parts:
            step_part(tmp, args, sections, data)
            save("cold_start_h200", TITLE, sections, data)  # what a timeout leaves is still written
        if "profile" in parts:
            profile_part(tmp, args, sections, data)
            save("cold_start_h200", TITLE, sections, data)
        if "procs" in parts:
            procs_part(tmp, args, sections, data)
            save("cold_start_h200", TITLE, sections, data)
        if "model" in parts:
            model_part(tmp, args, sections, data)
    save("cold_start_h200", TITLE, sections, data)


def main() -> None:
    p = argparse.ArgumentParser()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--cpu", action="store_true")
    g.add_argument("--gpu", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parts", default="step,procs,model")
    p.add_argument("--model-tokens", type=int, default=16384)
    p.add_argument("--model-layers", type=int, default=16)
    p.add_argument("--model-rounds", type=int, default=3)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--seqlen", type=int, default=6144)
    p.add_argument("--today", action="store_true", help="also one cold process without compile-ahead")
    a = p.parse_args()
    if a.gpu and "OUT" in os.environ:
        os.environ.setdefault("FA4CACHE_RESULTS", os.environ["OUT"])
    if a.cpu and "fork" in a.parts.split(","):
        # The fork part on this machine's cross-compiles (no GPU needed: warm compiles only).
        sections: list[tuple[str, str]] = []
        with tempfile.TemporaryDirectory() as t:
            fork_part(Path(t), a, sections, {}, env_with(**CPU_ENV, FA4CACHE_COMPILE_AHEAD="0"))
        save("cold_start_fork_cpu", "Where a child's compile time goes, on the CPU", sections, {})
    else:
        cpu(a) if a.cpu else gpu(a)


if __name__ == "__main__":
    main()
