"""Which parts of the toolchain change the bytes of a compiled kernel?

Compiles the same kernel set in several Python environments (a subprocess per
environment running ``fa4cache warm``, real ``cute.compile`` cross-compiling for sm_90 on
the CPU), each into its own store, then compares the stores pairwise: entries are
matched by (kind, key text), since the toolchain id (the store namespace) differs
between environments by design. For each pair it reports how many kernels were
compared, whether their object files are byte-identical, and if not what differs
(ELF sections, the embedded cubin's sections, strings only one side has); and the
undefined symbols of the objects, which tell what a kernel needs at load time.

Kernel sets (each one ``fa4cache warm`` run):

* ``document``: the default spec, document mask, forward + backward (4 kernels);
* ``causal``: ``--mask causal``, forward + backward (4 kernels);
* ``hf+quack``: a small Llama config with ``--with-quack``: its attention kernels
  (document varlen, forward + backward) and QuACK's RMSNorm and cross-entropy
  forward + backward (8 kernels).

14 distinct entries in all: the sets share two backward helper kernels (same key).

Usage (one compile at a time: the environments run one after another)::

    python3 benchmarks/bench_toolchain_bytes.py \\
        --env ref=/work/venvs/v311ref/bin/python --env cu13=/work/venvs/v311cu13/bin/python \\
        --pair "DSL libs=ref:cu13" --repeat ref --out benchmarks/results/toolchain_bytes.md

``--repeat NAME`` compiles NAME twice and adds a determinism row (NAME vs NAME#2);
``--reuse`` re-reads the stores under ``--work`` instead of compiling. A hand-written
preamble above the marker line in ``--out`` is kept; a ``.json`` with every pair's
per-kernel detail is written beside it. The script needs only the standard library (ELF
is parsed here, no binutils), so any Python runs it; each environment needs fa4cache[fa4].
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The hf+quack set: a config small enough to compile fast, with fields load_config reads.
HF_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 32000,
    "num_hidden_layers": 2,
    "intermediate_size": 2816,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}

# Cross-compiling for an H200 on a CPU host, as the project's CPU tests do; COMPILE_AHEAD=0
# so that warm compiles in its own process and nothing is left running in the background.
CROSS_ENV = {
    "FLASH_ATTENTION_ARCH": "sm_90",
    "CUTE_DSL_ARCH": "sm_90a",
    "FLASH_ATTENTION_NUM_SMS": "132",
    "FA4CACHE_COMPILE_AHEAD": "0",
}

# What each environment is made of, read from package metadata in that environment.
VERSIONS_SCRIPT = r"""
import json, platform, sys
from importlib import metadata
names = ["torch", "flash-attn-4", "quack-kernels", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
         "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13",
         "apache-tvm-ffi", "torch-c-dlpack-ext", "cuda-bindings", "fa4cache"]
out = {"python": platform.python_version(), "executable": sys.executable}
for n in names:
    try:
        out[n] = metadata.version(n)
    except metadata.PackageNotFoundError:
        pass
# The CUDA flavor the DSL picks at import (by the driver's version; the newest without one):
# what compiles, where several nvidia-cutlass-dsl-libs-cuXX are installed.
try:
    import cutlass._mlir._mlir_libs  # noqa: F401
    so = sys.modules["cutlass._mlir._mlir_libs._cutlass_ir"].__file__
    out["dsl flavor picked"] = so.rsplit("/", 1)[-1].split(".")[1]
except Exception as e:
    out["dsl flavor picked"] = f"? ({type(e).__name__})"
print(json.dumps(out))
"""


MARK = "<!-- bench_toolchain_bytes.py writes everything below this line -->"


@dataclass(frozen=True)
class Entry:
    """One store entry: its object file and what its sidecar says about it."""

    kind: str
    key: str
    sha256: str
    obj: Path
    toolchain: str


@dataclass
class EnvRun:
    name: str
    python: str
    store: Path
    versions: dict[str, str] = field(default_factory=dict)
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)


def kernel_sets(work: Path) -> dict[str, list[str]]:
    cfg = work / "hf_config" / "config.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps(HF_CONFIG))
    return {
        "document": [],
        "causal": ["--mask", "causal"],
        "hf+quack": ["--hf-config", str(cfg), "--with-quack", "--tokens", "1024"],
    }


def compile_env(name: str, python: str, store: Path, sets: dict[str, list[str]], log: Path) -> EnvRun:
    """Runs every kernel set through ``fa4cache warm`` in ``python``'s environment."""
    run = EnvRun(name, python, store)
    out = subprocess.run([python, "-c", VERSIONS_SCRIPT], capture_output=True, text=True, check=True)
    run.versions = json.loads(out.stdout)
    env = {**os.environ, **CROSS_ENV, "FA4CACHE_DIR": str(store)}
    # The child must import the environment's own fa4cache and packages, not ours.
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(var, None)
    t0 = time.perf_counter()
    with log.open("a") as f:
        for set_name, args in sets.items():
            cmd = [python, "-m", "fa4cache", "warm", "-j", "1", "-q", *args]
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            # cwd outside any checkout: a fa4cache/ directory in cwd would shadow the installed one.
            r = subprocess.run(cmd, env=env, cwd=str(log.parent), stdout=f, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                run.failed.append(set_name)
    run.seconds = time.perf_counter() - t0
    run.entries = read_store(store)
    return run


def read_store(store: Path) -> dict[tuple[str, str], Entry]:
    """Every entry of a store (layout v2/<toolchain>/<kind>/<digest>.{o,json}), by (kind, key)."""
    out: dict[tuple[str, str], Entry] = {}
    for sidecar in sorted(store.glob("v2/*/*/*.json")):
        meta = json.loads(sidecar.read_text())
        obj = sidecar.with_suffix(".o")
        if not obj.is_file() or meta.get("key") is None:
            continue
        out[(meta["kind"], meta["key"])] = Entry(
            meta["kind"], meta["key"], meta["sha256"], obj, meta["toolchain"]
        )
    return out


# ----------------------------------------------------------------------- ELF reading
# A minimal ELF64 little-endian reader (section headers and the symbol table): enough to
# say which sections differ and which symbols an object leaves undefined.


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


def elf_sections(data: bytes) -> list[Section]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size, link = struct.unpack_from(
            "<IIQQQQI", data, shoff + i * shentsize
        )
        raw.append((name, typ, off, size, link))
    if not raw:
        return []
    str_off = raw[shstrndx][2]

    def cstr(at: int) -> str:
        end = data.index(b"\0", at)
        return data[at:end].decode(errors="replace")

    return [Section(cstr(str_off + n), t, o, s, lk) for n, t, o, s, lk in raw]


def undefined_symbols(data: bytes) -> list[str]:
    secs = elf_sections(data)
    out: list[str] = []
    for s in secs:
        if s.type != 2:  # SHT_SYMTAB
            continue
        strtab = secs[s.link]
        for at in range(s.offset, s.offset + s.size, 24):
            st_name, _info, _other, shndx = struct.unpack_from("<IBBH", data, at)
            if shndx == 0 and st_name:
                end = data.index(b"\0", strtab.offset + st_name)
                out.append(data[strtab.offset + st_name : end].decode(errors="replace"))
    return sorted(set(out))


def embedded_elves(data: bytes) -> list[bytes]:
    """ELF images embedded in the object (the kernel's cubin lives in its read-only data)."""
    out = []
    for m in re.finditer(rb"\x7fELF\x02\x01", data[1:]):
        start = m.start() + 1
        secs = elf_sections(data[start:])
        if secs:
            end = max(s.offset + (0 if s.type == 8 else s.size) for s in secs)
            shoff = struct.unpack_from("<Q", data, start + 0x28)[0]
            shentsize, shnum = struct.unpack_from("<HH", data, start + 0x3A)
            out.append(data[start : start + max(end, shoff + shentsize * shnum)])
    return out


def generic_name(section: str) -> str:
    """A cubin's per-kernel sections (.text.<kernel>, .nv.info.<kernel>, ...) under one name."""
    head, sep, _ = section.partition("kernel_")
    return f"{head}<kernel>" if sep else section


def section_diff(a: bytes, b: bytes) -> list[str]:
    """Names of the sections whose contents differ (or that only one side has)."""
    sa = {s.name: a[s.offset : s.offset + s.size] for s in elf_sections(a) if s.type != 8}
    sb = {s.name: b[s.offset : s.offset + s.size] for s in elf_sections(b) if s.type != 8}
    return sorted({generic_name(n) for n in sa.keys() | sb.keys() if sa.get(n) != sb.get(n)})


def strings(data: bytes, n: int = 6) -> Counter[bytes]:
    return Counter(re.findall(rb"[\x20-\x7e]{%d,}" % n, data))


def describe_diff(a: bytes, b: bytes) -> dict[str, Any]:
    """What differs between two objects compiled from the same key."""
    out: dict[str, Any] = {"sizes": [len(a), len(b)], "sections": section_diff(a, b)}
    if len(a) == len(b):
        out["bytes_differing"] = sum(x != y for x, y in zip(a, b))
    ca, cb = embedded_elves(a), embedded_elves(b)
    out["cubins"] = [len(ca), len(cb)]
    out["cubin_sections"] = sorted(
        {s for x, y in zip(ca, cb) for s in section_diff(x, y)} if len(ca) == len(cb) else ["<count differs>"]
    )
    out["cubins_identical"] = len(ca) == len(cb) and all(x == y for x, y in zip(ca, cb))
    sa, sb = strings(a), strings(b)
    out["strings_only_a"] = [s.decode() for s in (sa - sb)][:8]
    out["strings_only_b"] = [s.decode() for s in (sb - sa)][:8]
    return out


def symbol_groups(syms: list[str]) -> dict[str, list[str]]:
    """Undefined symbols by what provides them at load time."""
    groups: dict[str, list[str]] = {}
    for s in syms:
        if s.startswith(("Py", "_Py")):
            g = "Python C-API"
        elif s.startswith("TVMFFI"):
            g = "tvm-ffi"
        elif s.startswith(("_cuda", "_cu", "cuda", "cu")):
            g = "CUDA (via the DSL runtime)"
        elif s.startswith("CuteDSLRT"):
            g = "CuTe DSL runtime"
        else:
            g = "other"
        groups.setdefault(g, []).append(s)
    return groups


def cubin_abis(run: EnvRun) -> list[str]:
    """The embedded cubins' ELF OS/ABI and ABI version: what the driver must accept at load
    (CUDA 13's ptxas writes a new cubin ELF ABI, OS/ABI 0x41 version 8; CUDA 12's 0x33 v7)."""
    out = set()
    for e in run.entries.values():
        for c in embedded_elves(e.obj.read_bytes()):
            out.add(f"OS/ABI {c[7]:#x} v{c[8]}")
    return sorted(out)


def env_symbols(run: EnvRun) -> list[str]:
    syms: set[str] = set()
    for e in run.entries.values():
        syms.update(undefined_symbols(e.obj.read_bytes()))
    return sorted(syms)


# ----------------------------------------------------------------------- comparing


def compare(a: EnvRun, b: EnvRun) -> dict[str, Any]:
    common = sorted(a.entries.keys() & b.entries.keys())
    only_a = sorted(a.entries.keys() - b.entries.keys())
    only_b = sorted(b.entries.keys() - a.entries.keys())
    identical, diffs = [], []
    for k in common:
        ea, eb = a.entries[k], b.entries[k]
        if ea.sha256 == eb.sha256:
            identical.append(k[0])
            continue
        d = describe_diff(ea.obj.read_bytes(), eb.obj.read_bytes())
        d["kind"] = k[0]
        d["objects"] = [str(ea.obj), str(eb.obj)]
        diffs.append(d)
    sym_a, sym_b = env_symbols(a), env_symbols(b)
    return {
        "a": a.name,
        "b": b.name,
        "compared": len(common),
        "identical": len(identical),
        "only_a": [k[0] for k in only_a],
        "only_b": [k[0] for k in only_b],
        "diffs": diffs,
        "symbols_a": sym_a,
        "symbols_b": sym_b,
    }


def differing_versions(a: EnvRun, b: EnvRun) -> str:
    keys = [k for k in a.versions.keys() | b.versions.keys() if k != "executable"]
    parts = [
        f"{k} {a.versions.get(k, '-')} / {b.versions.get(k, '-')}"
        for k in sorted(keys)
        if a.versions.get(k) != b.versions.get(k)
    ]
    return "; ".join(parts) or "none (same versions)"


def what_differs(c: dict[str, Any]) -> str:
    if not c["diffs"]:
        notes = []
    else:
        secs = Counter(s for d in c["diffs"] for s in d["sections"])
        cubin = Counter(s for d in c["diffs"] for s in d["cubin_sections"])
        notes = [
            f"{len(c['diffs'])} objects differ ({', '.join(sorted({d['kind'] for d in c['diffs']}))}): "
            f"sections {dict(secs)}",
            f"cubin sections {dict(cubin) or 'none'}",
            f"device code (cubin .text) differs in {cubin.get('.text.<kernel>', 0)}",
            f"host code (.ltext) differs in {secs.get('.ltext', 0)}",
        ]
        sizes = {tuple(d["sizes"]) for d in c["diffs"]}
        if all(a == b for a, b in sizes):
            notes.append("same sizes")
    if c["only_a"] or c["only_b"]:
        notes.append(f"key text differs: {len(c['only_a'])} / {len(c['only_b'])} entries unmatched")
    return "; ".join(notes) or "-"


def ids_note(a: EnvRun, b: EnvRun, same_bytes: bool) -> str:
    """Whether fingerprint.py's toolchain ids agree, and what that means given the bytes."""
    same_ids = {e.toolchain for e in a.entries.values()} == {e.toolchain for e in b.entries.values()}
    if same_ids:
        return "same" if same_bytes else "**same: wrong hit** (one id, other bytes)"
    return "differ: needless miss" if same_bytes else "differ"


def symbols_note(c: dict[str, Any]) -> str:
    a, b = set(c["symbols_a"]), set(c["symbols_b"])
    groups = symbol_groups(sorted(a | b))
    counts = ", ".join(f"{g} {len(v)}" for g, v in sorted(groups.items()))
    if a == b:
        return f"same {len(a)} ({counts})"
    return f"differ: only {c['a']} {sorted(a - b)}; only {c['b']} {sorted(b - a)}"


def markdown(
    runs: dict[str, EnvRun], pairs: list[tuple[str, str, str]], results: list[dict[str, Any]], command: str
) -> str:
    lines = [
        "## Table",
        "",
        "| factor | A | B | kernels compared | bytes identical | today's toolchain ids | what differs "
        "| undefined symbols of note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (factor, a, b), c in zip(pairs, results):
        same = c["compared"] > 0 and c["identical"] == c["compared"]
        ident = f"{'y' if same else 'n'} ({c['identical']}/{c['compared']})"
        lines.append(
            f"| {factor} | {a} | {b} | {c['compared']} | {ident} | {ids_note(runs[a], runs[b], same)} "
            f"| {what_differs(c)} | {symbols_note(c)} |"
        )
    lines += ["", "Versions that differ within each pair:", ""]
    for (factor, a, b), _ in zip(pairs, results):
        lines.append(f"- {factor} ({a} vs {b}): {differing_versions(runs[a], runs[b])}")
    lines += ["", "Strings found in only one side of the first differing object of each pair", ""]
    for (factor, a, b), c in zip(pairs, results):
        if c["diffs"]:
            d = c["diffs"][0]
            only_a = [s[:120] for s in d["strings_only_a"]]
            only_b = [s[:120] for s in d["strings_only_b"]]
            lines.append(f"- {factor} ({d['kind']}): only {a} {only_a}; only {b} {only_b}")
    lines += [
        "",
        "## Environments",
        "",
        "| name | python | versions | toolchain ids (FA4 / QuACK namespaces) | cubin ELF ABI | kernels "
        "| failed sets | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs.values():
        v = ", ".join(f"{k} {val}" for k, val in r.versions.items() if k not in ("python", "executable"))
        ids = " ".join(sorted({e.toolchain for e in r.entries.values()}))
        lines.append(
            f"| {r.name} | {r.python} ({r.versions.get('python')}) | {v} | {ids} | {', '.join(cubin_abis(r))} "
            f"| {len(r.entries)} | "
            f"{', '.join(r.failed) or '-'} | {r.seconds:.0f} |"
        )
    all_syms = sorted({s for r in runs.values() for s in env_symbols(r)})
    lines += ["", "## Undefined symbols (all environments, all objects)", ""]
    for g, syms in sorted(symbol_groups(all_syms).items()):
        lines.append(f"- {g}: {', '.join(f'`{s}`' for s in syms)}")
    lines += ["", "## Command", "", "```", command, "```", ""]
    return "\n".join(lines)


def parse_env(text: str) -> tuple[str, str]:
    name, sep, python = text.partition("=")
    if not sep or not name or not python:
        raise argparse.ArgumentTypeError(f"expected NAME=/path/to/python, got {text!r}")
    return name, python


def parse_pair(text: str) -> tuple[str, str, str]:
    factor, sep, rest = text.rpartition("=")
    a, sep2, b = rest.partition(":")
    if not sep or not sep2:
        raise argparse.ArgumentTypeError(f"expected 'FACTOR=A:B', got {text!r}")
    return factor, a, b


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", type=parse_env, action="append", required=True, help="NAME=/path/to/python")
    p.add_argument("--pair", type=parse_pair, action="append", default=[], help="'FACTOR=A:B' (env names)")
    p.add_argument("--repeat", action="append", default=[], help="compile this env twice (determinism)")
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_toolchain_bytes"))
    p.add_argument("--reuse", action="store_true", help="read stores already compiled under --work")
    p.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "toolchain_bytes.md"
    )
    args = p.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    sets = kernel_sets(args.work)
    log = args.work / "warm.log"
    todo = [(n, py, args.work / n) for n, py in args.env]
    todo += [(f"{n}#2", dict(args.env)[n], args.work / f"{n}#2") for n in args.repeat]
    runs: dict[str, EnvRun] = {}
    for name, python, store in todo:
        facts = args.work / f"{name}.run.json"
        if args.reuse and store.is_dir():
            r = EnvRun(name, python, store, entries=read_store(store))
            out = subprocess.run([python, "-c", VERSIONS_SCRIPT], capture_output=True, text=True, check=True)
            r.versions = json.loads(out.stdout)
            # The compile run's own facts (duration, failed sets), kept beside its store.
            if facts.is_file():
                saved = json.loads(facts.read_text())
                r.seconds, r.failed = saved["seconds"], saved["failed"]
        else:
            if store.exists():
                raise SystemExit(f"{store} exists: remove it, or pass --reuse")
            print(f"[{time.strftime('%H:%M:%S')}] compiling in {name} ({python})", flush=True)
            r = compile_env(name, python, store, sets, log)
            facts.write_text(json.dumps({"seconds": r.seconds, "failed": r.failed}))
        runs[name] = r
        print(f"  {name}: {len(r.entries)} entries, failed sets: {r.failed or '-'}", flush=True)
    pairs = list(args.pair) + [("determinism (same env twice)", n, f"{n}#2") for n in args.repeat]
    results = [compare(runs[a], runs[b]) for _, a, b in pairs]
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    text = markdown(runs, pairs, results, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # A hand-written conclusion above the marker survives a re-run; the measurements below it do not.
    head = ""
    if args.out.is_file() and MARK in (old := args.out.read_text()):
        head = old.split(MARK, 1)[0]
    args.out.write_text(f"{head}{MARK}\n\n{text}")
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "pairs": [list(p) for p in pairs],
                "results": results,
                "envs": {n: r.versions for n, r in runs.items()},
            },
            indent=1,
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
