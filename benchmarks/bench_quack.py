"""A training step with QuACK RMSNorm + QuACK cross-entropy + FA4 attention (one H200):
fa4cache's store vs QuACK's (and FA4's) own caches, in real processes.

The step: x -> quack.rmsnorm -> qkv projection -> FA4 causal attention -> output projection
+ residual -> quack.rmsnorm -> vocabulary projection -> quack.cross_entropy, then backward.

Runs, each a fresh process (imports excluded from the step times):

1. ``own cold`` / ``own warm``: without fa4cache; QuACK's own ``.o`` cache and FA4's own
   cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``) in empty directories, then again.
   The cold run's loss and gradients are the reference.
2. ``fa4cache cold x4``: four processes lined up on an empty store: every kernel
   (FA4's and QuACK's) must be compiled once over the four, QuACK's directory stay empty.
3. ``fa4cache warm``: a new process on that store: 0 compiles.
4. ``warm --with-quack``: QuACK's kernels warmed from the step's sizes alone into a store
   holding only the FA4 kernels, then a step: 0 compiles (warm's keys are the step's).

Every run's loss and gradients are compared with the reference (bitwise when FA4's
deterministic backward is available on this GPU). Writes quack_h200.{md,json} to
$FA4CACHE_RESULTS, else $OUT, else benchmarks/results; exits 1 if a check fails.

    python3 benchmarks/bench_quack.py            # ~2-3 minutes on one H200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
QUACK_KINDS = (
    "quack.rmsnorm_fwd",
    "quack.rmsnorm_bwd",
    "quack.cross_entropy",
    "quack.cross_entropy_backward",
)


# --------------------------------------------------------------------------- the step (worker side)


def build(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    D, V, H = args.hidden, args.vocab, args.heads

    def p(*shape: int, scale: float) -> Any:
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g) * scale
        return t.requires_grad_()

    return {
        "x": p(args.batch, args.seqlen, D, scale=1.0),
        "w_norm": (torch.ones(D, device="cuda", dtype=torch.bfloat16) + 0).requires_grad_(),
        "w_qkv": p(D, 3 * D, scale=D**-0.5),
        "w_o": p(D, D, scale=D**-0.5),
        "w_final": (torch.ones(D, device="cuda", dtype=torch.bfloat16) + 0).requires_grad_(),
        "w_vocab": p(D, V, scale=D**-0.5),
        "targets": torch.randint(0, V, (args.batch * args.seqlen,), device="cuda", generator=g),
        "H": H,
    }


def step(m: dict[str, Any], deterministic: bool) -> Any:
    from flash_attn.cute import flash_attn_func
    from quack.cross_entropy import cross_entropy
    from quack.rmsnorm import rmsnorm

    x = m["x"]
    B, S, D = x.shape
    H = m["H"]
    h = rmsnorm(x, m["w_norm"], eps=1e-6)
    q, k, v = (t.contiguous() for t in (h @ m["w_qkv"]).view(B, S, 3, H, D // H).unbind(2))
    o = flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
    o = o[0] if isinstance(o, tuple) else o
    y = x + o.reshape(B, S, D) @ m["w_o"]
    z = rmsnorm(y, m["w_final"], eps=1e-6)
    logits = z.view(B * S, D) @ m["w_vocab"]
    loss = cross_entropy(logits, m["targets"])
    loss.backward()
    return loss


def worker(args: argparse.Namespace) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    t_start = time.perf_counter()
    store = None
    if args.mode == "fa4cache":
        import fa4cache

        store = fa4cache.install()
    import flash_attn.cute  # noqa: F401
    import quack  # noqa: F401
    import torch

    out: dict[str, Any] = {"import_s": time.perf_counter() - t_start}
    if args.warm_quack:  # what `fa4cache warm --hf-config ... --with-quack --tokens B*S` compiles
        from fa4cache.adapters.compile.warm_jit_calls import quack_calls

        t0 = time.perf_counter()
        rs = fa4cache.warm(quack_calls(args.hidden, args.vocab, ["bf16"], [args.batch * args.seqlen])).rows
        out["warm_quack"] = [[r.label, r.compiled, r.present, r.error] for r in rs]
        out["warm_quack_s"] = time.perf_counter() - t0
        assert store is not None
        store.counters.flush()
    m = build(args)
    if args.ready:
        Path(args.ready).touch()
        while not os.path.exists(args.go):
            time.sleep(0.01)
    before = {k: dict(v) for k, v in store.counters.by_kind.items()} if store is not None else {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    deterministic = True
    try:
        loss = step(m, deterministic)
    except Exception as e:  # FA4's deterministic backward may not exist for this GPU / shape
        out["deterministic_error"] = f"{type(e).__name__}: {e}"[:300]
        for t in m.values():
            if hasattr(t, "grad"):
                t.grad = None
        deterministic = False
        loss = step(m, deterministic)
    torch.cuda.synchronize()
    out["first_step_s"] = time.perf_counter() - t0
    for t in m.values():
        if hasattr(t, "grad"):
            t.grad = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = step(m, deterministic)
    torch.cuda.synchronize()
    out["second_step_s"] = time.perf_counter() - t0
    out["deterministic"] = deterministic
    out["loss"] = float(loss)
    grads = {k: t.grad.detach().cpu() for k, t in m.items() if hasattr(t, "grad") and t.grad is not None}
    torch.save({"loss": loss.detach().cpu(), **grads}, args.tensors)
    if store is not None:
        import fa4cache.adapters.patch as fa
        from fa4cache.adapters.jit.jit_cache import fold_all_hits

        fa.fold_all_hits()
        fold_all_hits()
        after = store.counters.by_kind
        out["compiles"] = {
            k: int(v.get("compiles", 0) - before.get(k, {}).get("compiles", 0)) for k, v in after.items()
        }
        out["compiles"] = {k: v for k, v in out["compiles"].items() if v}
        store.counters.flush()
    else:
        rn, ce = sys.modules["quack.rmsnorm"], sys.modules["quack.cross_entropy"]
        fns = [rn._compile_rmsnorm_fwd, rn._compile_rmsnorm_bwd, ce.CrossEntropy.compile]
        out["quack_compiles"] = sum(f.cache_info().misses for f in fns + [ce.CrossEntropyBackward.compile])
    Path(args.result).write_text(json.dumps(out))


# --------------------------------------------------------------------------- orchestration


def start(args: argparse.Namespace, tmp: Path, name: str, mode: str, env: dict[str, str], *extra: str) -> Any:
    cmd = [sys.executable, str(HERE), "--worker", "--mode", mode, "--result", str(tmp / f"{name}.json")]
    cmd += ["--tensors", str(tmp / f"{name}.pt"), *extra]
    for a in ("batch", "seqlen", "hidden", "heads", "vocab"):
        cmd += [f"--{a}", str(getattr(args, a))]
    full = {**os.environ, **env}
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115  (closed by finish)
    return subprocess.Popen(cmd, env=full, stdout=log, stderr=subprocess.STDOUT), log, name


def finish(tmp: Path, run: Any) -> dict[str, Any]:
    proc, log, name = run
    rc = proc.wait(timeout=400)
    log.close()
    if rc != 0:
        print((tmp / f"{name}.log").read_text()[-4000:], file=sys.stderr)
        raise SystemExit(f"{name} failed ({rc})")
    return json.loads((tmp / f"{name}.json").read_text())


def compare(tmp: Path, name: str, ref: str = "own_cold") -> tuple[bool, float, bool]:
    import torch

    a, b = torch.load(tmp / f"{ref}.pt"), torch.load(tmp / f"{name}.pt")
    exact = all(torch.equal(a[k], b[k]) for k in a)
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    close = all(torch.allclose(a[k].float(), b[k].float(), rtol=1e-2, atol=1e-2) for k in a)
    return exact, diff, close


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode", choices=["fa4cache", "own"], default="own")
    p.add_argument("--result")
    p.add_argument("--tensors")
    p.add_argument("--ready")
    p.add_argument("--go")
    p.add_argument("--warm-quack", action="store_true")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    t_all = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench_quack_"))
    own_env = {
        "FA4CACHE_DISABLE": "1",
        "QUACK_CACHE_DIR": str(tmp / "own_quack"),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(tmp / "own_fa4"),
    }
    private = tmp / "quack_private"
    ours_env = {"FA4CACHE_DIR": str(tmp / "store"), "QUACK_CACHE_DIR": str(private)}
    runs: dict[str, dict[str, Any]] = {}
    try:
        runs["own_cold"] = finish(tmp, start(args, tmp, "own_cold", "own", own_env))
        runs["own_warm"] = finish(tmp, start(args, tmp, "own_warm", "own", own_env))
    except SystemExit as e:  # FA4's own disk cache failing: the baseline keeps QuACK's cache only
        print(f"{e}; again without FA4's own cache", file=sys.stderr)
        own_env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "0"
        runs["own_cold"] = finish(tmp, start(args, tmp, "own_cold", "own", own_env))
        runs["own_warm"] = finish(tmp, start(args, tmp, "own_warm", "own", own_env))
    go = tmp / "go"
    cold = [
        start(args, tmp, f"cold{i}", "fa4cache", ours_env, "--ready", str(tmp / f"ready{i}"), "--go", str(go))
        for i in range(4)
    ]
    deadline = time.monotonic() + 300
    while not all((tmp / f"ready{i}").exists() for i in range(4)) and time.monotonic() < deadline:
        if any(r[0].poll() is not None for r in cold):
            break
        time.sleep(0.05)
    go.touch()
    for i, r in enumerate(cold):
        runs[f"cold{i}"] = finish(tmp, r)
    runs["warm"] = finish(tmp, start(args, tmp, "warm", "fa4cache", ours_env))

    import fa4cache

    st = fa4cache.stats(tmp / "store")
    # Run 4: the store's FA4 entries only, then QuACK's from warm --with-quack, then a step.
    check = tmp / "check"
    shutil.copytree(tmp / "store", check, symlinks=True, ignore=shutil.ignore_patterns("stats", "locks"))
    for kind_dir in check.glob("v2/*/quack.*"):
        shutil.rmtree(kind_dir)
    runs["warm_cli"] = finish(
        tmp,
        start(args, tmp, "warm_cli", "fa4cache", {**ours_env, "FA4CACHE_DIR": str(check)}, "--warm-quack"),
    )

    cold_names = [f"cold{i}" for i in range(4)]
    compiles: dict[str, int] = {}
    for n in cold_names:
        for k, v in runs[n]["compiles"].items():
            compiles[k] = compiles.get(k, 0) + v
    checks = {
        "each kernel compiled once over the 4 cold processes": bool(compiles)
        and all(v == 1 for v in compiles.values()),
        "QuACK kernels among them": all(k in compiles for k in QUACK_KINDS),
        "store stats agree (compiles by kind)": all(
            st["by_kind"].get(k, {}).get("compiles") == v for k, v in compiles.items()
        ),
        "warm process compiled 0": not runs["warm"]["compiles"],
        "QuACK's own directory untouched by fa4cache runs": not private.exists()
        or not any(private.iterdir()),
        "warm --with-quack compiled the 4 QuACK kernels": sum(r[1] for r in runs["warm_cli"]["warm_quack"])
        == 4,
        "a step after warm --with-quack compiled 0": not runs["warm_cli"]["compiles"],
    }
    rows, eq = [], {}
    for n in ["own_cold", "own_warm", *cold_names, "warm", "warm_cli"]:
        r = runs[n]
        exact, diff, close = compare(tmp, n) if n != "own_cold" else (True, 0.0, True)
        eq[n] = {"bitwise": exact, "max_abs_diff": diff, "allclose": close}
        det = r["deterministic"]
        checks[f"{n}: loss and gradients equal the reference"] = exact if det else close
        compiled = r.get("compiles")
        rows.append(
            [
                n,
                "fa4cache" if "compiles" in r else "QuACK+FA4 own caches",
                f"{r['first_step_s']:.2f}",
                f"{r['second_step_s'] * 1e3:.1f}",
                "-" if compiled is None else sum(compiled.values()),
                r.get("quack_compiles", "-"),
                f"{r['import_s']:.1f}",
                "bitwise" if exact else f"max diff {diff:.2e}",
            ]
        )
    sys.path.insert(0, str(HERE.parent))
    from common import save, table

    if "FA4CACHE_RESULTS" not in os.environ and os.environ.get("OUT"):
        os.environ["FA4CACHE_RESULTS"] = os.environ["OUT"]
    from importlib import metadata

    cfg = (
        f"batch {args.batch} x seqlen {args.seqlen}, hidden {args.hidden}, {args.heads} heads, vocab {args.vocab}, "
        f"bf16; quack-kernels {metadata.version('quack-kernels')}"
    )
    save(
        "quack_h200",
        "Training step with QuACK RMSNorm + cross-entropy + FA4 attention: fa4cache vs QuACK's own cache",
        [
            (
                "Step",
                cfg
                + f"; FA4 deterministic backward: {runs['own_cold']['deterministic']}"
                + f"; FA4's own disk cache in the baseline: {own_env['FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED'] == '1'}",
            ),
            (
                "First step per fresh process (imports excluded)",
                table(
                    [
                        "run",
                        "cache",
                        "first step s",
                        "next step ms",
                        "compiles (store)",
                        "QuACK compiles",
                        "import s",
                        "vs reference",
                    ],
                    rows,
                ),
            ),
            (
                "Compiles over the 4 cold processes, by kind",
                table(["kind", "compiles"], sorted(compiles.items())),
            ),
            ("Checks", table(["check", "ok"], [[k, v] for k, v in checks.items()])),
        ],
        {
            "config": vars(args),
            "runs": runs,
            "compiles": compiles,
            "equality": eq,
            "checks": checks,
            "stats": st,
            "wall_s": time.perf_counter() - t_all,
        },
    )
    print(f"wall {time.perf_counter() - t_all:.0f} s; {sum(checks.values())}/{len(checks)} checks passed")
    shutil.rmtree(tmp, ignore_errors=True)
    raise SystemExit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
