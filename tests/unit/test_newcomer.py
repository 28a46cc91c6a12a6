"""A newcomer's first hour: the README's commands and quick start lines as written (the
manual in docs/ says the same), errors that name the argument and the fix, a CLI with one
toolchain story, help on every flag, exit codes 0 (success), 1 (a check failed), 2 (bad
input). The README's and the docs' snippets themselves run in tests/test_docs.py.

Fast: the CLI runs in subprocesses on stores written through the real Store API (no
compile); the quick start runs once in a fresh process with no target arch set.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import fa4cache
from fa4cache.arch import ARCH_VAR, ARCHS, DSL_ARCH_VAR, NUM_SMS_VAR
from fa4cache.store.paths import LAYOUT, EntryRef
from fa4cache.store.store import Store
from tests.conftest import ROOT, run_cli

OLD = "0123456789abcdef0123"  # a toolchain that holds kernels
EMPTY = "fedcba9876543210fedc"  # one recorded by a process that compiled nothing


def _clean_env(cache_dir: Path) -> dict[str, str]:
    """This machine as a newcomer has it: no target arch named anywhere."""
    env = {k: v for k, v in os.environ.items() if k not in (ARCH_VAR, DSL_ARCH_VAR, NUM_SMS_VAR)}
    env["FA4CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = str(ROOT)
    return env


def _store(root: Path) -> Store:
    return Store.at(root)


def _publish(store: Store, tc: str, kind: str, n: int, *, spec: Any = None, dtype: str = "bf16") -> EntryRef:
    ref = EntryRef(tc, kind, f"{n:064x}")
    summary = {"dtype": dtype, "head_dim": 128, "mask": "b2f70b3b0552"}
    assert store.publish_bytes(
        ref, b"\x7fELF" + bytes(200 + n), summary=summary, spec=spec, compile_seconds=1.5
    )
    return ref


def _age_toolchain(store: Store, tc: str, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(store.layout.toolchain_dir(tc) / "toolchain.json", (t, t))


@pytest.fixture
def two_toolchains(tmp_path: Path) -> Path:
    """A store whose kernels belong to OLD (used an hour ago), and an EMPTY toolchain recorded
    since (what a failed start used to leave behind)."""
    root = tmp_path / "cache"
    store = _store(root)
    spec = {"mask": "document", "dtype": "bf16", "head_dim": 128, "window": 256, "block_size": 16}
    store.record_toolchain(OLD, {"id": OLD})
    _publish(store, OLD, "fwd", 1, spec=spec)
    _publish(store, OLD, "bwd", 2, spec=spec)
    _age_toolchain(store, OLD, 3600)
    store.record_toolchain(EMPTY, {"id": EMPTY})
    return root


# ---------------------------------------------------------------- 1-3: the README as written

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The two commands, exactly: .ci/run runs the test command, install.sh the extras.
INSTALL_WARM_STATS = "bash scripts/install.sh && .venv/bin/fa4cache warm && .venv/bin/fa4cache stats"
TEST_COMMAND = ".venv/bin/python -m pytest -q -n 2 --dist loadgroup tests"
FAST_TIER = '.venv/bin/python -m pytest -q -m "not slow and not compile and not ray" tests'


def _snippet(path: Path, first_line: str) -> str:
    """The fenced block of ``path`` whose first line is ``first_line``."""
    blocks = path.read_text().split("```")[1::2]
    found = [b for b in blocks if b.split("\n", 1)[1:] and b.split("\n", 1)[1].startswith(first_line)]
    assert found, f"{path.name}: no snippet starting with {first_line!r}"
    return found[0]


def test_readme_and_docs_give_the_two_commands_ci_runs() -> None:
    for path in (README, DOCS / "index.md"):
        text = path.read_text()
        assert INSTALL_WARM_STATS in text and TEST_COMMAND in text and FAST_TIER in text, path
    # CI installs, runs exactly the test command, then the overlay legs (other releases) and ruff.
    ci = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")
    ]
    install = ci.index("bash scripts/install.sh")
    assert ci[install + 1] == TEST_COMMAND, ci
    assert all(line.startswith(("bash scripts/test_overlay.sh", " ")) for line in ci[install + 2 : -2]), ci
    assert ci[-2:] == [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."], ci
    assert '".[fa4,ray,transformers,test]"' in (ROOT / "scripts" / "install.sh").read_text()
    # Installed from a checkout or git, never a bare name from PyPI (it is not there).
    for path in (README, DOCS / "index.md"):
        assert not re.search(r"pip install (-U )?fa4cache\b(?!\[)", path.read_text()), path


def test_quick_start_and_transformers_lines_on_a_cpu_machine_without_a_target(tmp_path: Path) -> None:
    # The README's quick start and transformers lines (the same in docs/masks.md and
    # docs/transformers.md), in a fresh process on this CPU machine with no
    # FLASH_ATTENTION_ARCH: nothing raises, one warning names the variable, and no
    # toolchain is recorded (nothing can compile for no target).
    quick = _snippet(README, "# needs: GPU, your data loader")
    assert quick in (DOCS / "masks.md").read_text()
    for line in (
        "fa4cache.install()",
        "from flash_attn.cute import flash_attn_func",
        "mask = fa4cache.make_document_mask(batch.cu_seqlens, seqlen=q.shape[1])",
        "out = fa4cache.attention(q, k, v, mask)",
    ):
        assert line in quick, line
    assert "fa4cache.adapters.transformers.register()" in _snippet(README, "# needs: GPU, a model name")
    assert "fa4cache.adapters.transformers.register()" in (DOCS / "transformers.md").read_text()
    code = """
import sys
import fa4cache
assert "fa4cache.adapters" not in sys.modules
fa4cache.install()
from flash_attn.cute import flash_attn_func
import torch
mask = fa4cache.make_document_mask(torch.tensor([0, 212, 512]), seqlen=512)
q = torch.randn(1, 512, 2, 64, dtype=torch.bfloat16)
try:
    fa4cache.attention(q, q, q, mask)
except ValueError as e:
    print("ATTENTION", e)
fa4cache.adapters.transformers.register()
print("OK")
"""
    d = tmp_path / "cache"
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_clean_env(d),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("OK")
    assert "ATTENTION q: fa4cache.attention runs FA4's kernels, which need CUDA tensors" in p.stdout
    assert f"set {ARCH_VAR}=sm_90" in p.stderr and "no CUDA GPU is visible" in p.stderr
    assert not list((d / LAYOUT).glob("*/toolchain.json"))  # no empty toolchain recorded


def test_package_face_lists_no_typing_helpers_and_resolves_adapters() -> None:
    names = dir(fa4cache)
    assert not {"Any", "TYPE_CHECKING", "annotations"} & set(names)
    assert {"adapters", "install", "make_document_mask", "attention", "__version__"} <= set(names)
    assert fa4cache.adapters.compile.warm_specs.__name__ == "fa4cache.adapters.compile.warm_specs"
    assert "transformers" in dir(fa4cache.adapters)
    with pytest.raises(AttributeError, match="nope"):
        fa4cache.adapters.nope  # noqa: B018


_NO_TORCH = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "flash_attn", "cutlass", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
"""


def test_transformers_extra_alone_names_the_fa4_extra(tmp_path: Path) -> None:
    # pyproject: the [transformers] extra brings [fa4]; without its packages the adapter and
    # warm say which extra to install (as a pip install line), not "No module named 'torch'".
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "fa4cache[fa4]" in extras["transformers"]
    code = _NO_TORCH + (
        "import fa4cache\n"
        "try:\n    fa4cache.adapters.transformers.register()\nexcept fa4cache.FA4NotAvailable as e:\n"
        "    print('REGISTER', e)\n"
        "from fa4cache.cli import main\nsys.exit(main(['--cache-dir', sys.argv[1], 'warm']))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "REGISTER" in p.stdout and "pip install 'fa4cache[fa4]'" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 2 and "fa4cache warm: compiling kernels needs torch" in p.stderr
    assert "pip install 'fa4cache[fa4]'" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------- 5/6: clear errors


def test_mask_input_errors_name_the_argument() -> None:
    mask = fa4cache.make_document_mask(torch.tensor([0, 212, 512]), seqlen=512)
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor .* got list"):
        mask.check([1, 2])
    with pytest.raises(TypeError, match=r"^seqlen: expected an int, got str '512'"):
        fa4cache.make_document_mask(torch.tensor([0, 512]), seqlen="512")
    for bad in (-1, 0):
        with pytest.raises(ValueError, match=rf"^seqlen: expected a positive int, got {bad}"):
            fa4cache.make_document_mask(torch.tensor([0, 512]), seqlen=bad)
    with pytest.raises(ValueError, match=r"^prefix_lengths: 999 for document 0, which has 212 tokens"):
        fa4cache.make_document_mask(torch.tensor([0, 212, 512]), prefix_lengths=torch.tensor([999, 3]))
    with pytest.raises(ValueError, match=r"^head_dim: FA4 supports head dims 1 to 256, got 512"):
        mask.for_head_dim(512)
    assert mask.for_head_dim(256) is not None


def test_prefix_longer_than_its_document_is_refused_exactly_then() -> None:
    # The space: random packings (cu_seqlens and 2-row document_ids) and prefixes around
    # each document's length; an error exactly when one exceeds it, else the reference mask.
    # Drawn in the test, not at collection (parallel workers must collect the same tests).
    seed = int(os.environ.get("FA4CACHE_TEST_SEED", random.randrange(2**31)))
    print(f"seed {seed} (FA4CACHE_TEST_SEED={seed} repeats it)")
    rng = random.Random(seed)
    for _ in range(25):
        rows = [[rng.randint(1, 40) for _ in range(rng.randint(1, 4))] for _ in range(2)]
        T = max(sum(r) for r in rows)
        rows = [r[:-1] + [r[-1] + T - sum(r)] for r in rows]  # both rows T tokens long
        pref = [[rng.choice([0, n // 2, n, n + 1, n + 7]) for n in r] for r in rows]
        too_long = any(p > n for r, pr in zip(rows, pref) for p, n in zip(pr, r))
        ids = torch.tensor([[d for d, n in enumerate(r) for _ in range(n)] for r in rows])
        width = max(len(r) for r in rows)
        p = torch.tensor([pr + [0] * (width - len(pr)) for pr in pref])
        cu = torch.tensor([0, *[sum(rows[0][: i + 1]) for i in range(len(rows[0]))]])
        for kw in (
            {"document_ids": ids, "prefix_lengths": p},
            {"cu_seqlens": cu, "prefix_lengths": p[0, : len(rows[0])]},
        ):
            bad = too_long if "document_ids" in kw else any(a > n for a, n in zip(pref[0], rows[0]))
            if bad:
                with pytest.raises(ValueError, match="^prefix_lengths: "):
                    fa4cache.make_document_mask(**kw)
            else:
                dense = fa4cache.make_document_mask(**kw).dense()
                for b, (r, pr) in enumerate(zip(rows, pref)):
                    if b >= dense.shape[0]:
                        break
                    start = 0
                    for n, pl in zip(r, pr):
                        for i in range(start, start + n):
                            hi = start + pl if i < start + pl else i + 1  # prefix: bidirectional
                            want = torch.zeros(T, dtype=torch.bool)
                            want[start:hi] = True
                            assert torch.equal(dense[b, i], want), (seed, r, pr, i)
                        start += n


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_builder_without_a_gpu_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"^device: .* no CUDA GPU is visible here; pass device='cpu'"):
        fa4cache.DocumentMaskBuilder(512, max_documents=8)
    with pytest.raises(TypeError, match="^seqlen: expected an int, got str"):
        fa4cache.DocumentMaskBuilder("512", max_documents=8, device="cpu")
    build = fa4cache.DocumentMaskBuilder(512, max_documents=8, device="cpu")
    assert build(torch.tensor([0, 100, 512])).seqlen == 512


def test_mask_repr_is_short() -> None:
    mask = fa4cache.make_document_mask(torch.tensor([0, 3000, 8192]), seqlen=8192, window=64)
    r = repr(mask)
    assert len(r) < 300, r
    assert r.startswith(
        "AttentionMask(name='document_causal_window', batch=1, seqlen=8192, aux_tensors=[int32[1, "
    )


# ---------------------------------------------------------------- 7-11: the CLI


def test_doctor_exits_1_on_a_failed_check_and_names_the_jobs_toolchain(two_toolchains: Path) -> None:
    env = {ARCH_VAR: "", DSL_ARCH_VAR: "", NUM_SMS_VAR: ""}
    p = run_cli(two_toolchains, "doctor", env=env)
    assert p.returncode == 0, p.stdout
    assert f"toolchain (store)            {OLD}" in p.stdout  # the one with kernels, not EMPTY
    assert "toolchain (jobs here)        none (no target)" in p.stdout
    assert f"no GPU and {ARCH_VAR} unset" in p.stdout
    p = run_cli(two_toolchains, "doctor", env={ARCH_VAR: "sm_90", DSL_ARCH_VAR: "sm_90a", NUM_SMS_VAR: "132"})
    assert "target                       sm_90, 132 SMs (from the environment)" in p.stdout
    assert f"not the store's current one {OLD}" in p.stdout
    # ...and why, in words: the fixture's old toolchain has no description of this key format.
    assert "[warn] store kernels fit here?      no: " in p.stdout, p.stdout
    os.chmod(two_toolchains, 0o777)  # world-writable: a failed check
    p = run_cli(two_toolchains, "doctor")
    assert "[FAIL] cache directory" in p.stdout and "writable by group or others" in p.stdout
    assert "directory not created yet" not in p.stdout and p.returncode == 1


def test_one_toolchain_story_in_stats_ls_and_prune(two_toolchains: Path) -> None:
    st = json.loads(run_cli(two_toolchains, "stats", "--json").stdout)
    assert st["by_toolchain"][OLD]["current"]
    # The dry run says what would go and removes nothing (exit 0).
    dry = run_cli(two_toolchains, "prune", "--fingerprint", "stale", "--stale-after", "0s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove empty toolchain directory {EMPTY}" in dry.stdout
    assert "dry run: would remove 0 entries" in dry.stdout
    assert (two_toolchains / LAYOUT / EMPTY).is_dir()
    p = run_cli(two_toolchains, "prune", "--fingerprint", "stale", "--stale-after", "0s")
    assert p.returncode == 0, p.stderr
    assert "removed 0 entries" in p.stdout and "removed 1 empty toolchain directory" in p.stdout
    assert not (two_toolchains / LAYOUT / EMPTY).exists()
    assert len(list((two_toolchains / LAYOUT / OLD).glob("*/*.o"))) == 2  # the current one stays


def test_cli_messages_and_exit_codes(two_toolchains: Path) -> None:
    p = run_cli(two_toolchains, "prune")
    assert p.returncode == 2 and p.stderr.strip() == (
        "fa4cache prune: give --max-size, --older-than and/or --fingerprint stale"
    )
    p = run_cli(two_toolchains, "clear", input="")
    assert (
        p.returncode == 2
        and p.stderr.startswith("fa4cache clear: refusing")
        and "clear: clear" not in p.stderr
    )
    z = run_cli(two_toolchains, "stats", "--zero", "--json")
    assert z.returncode == 0 and json.loads(z.stdout)["zeroed"] is True
    p = run_cli(two_toolchains, "ls", "--kind", "nope")
    assert p.returncode == 2 and p.stderr.strip() == (
        "fa4cache ls: --kind: no entries of kind 'nope'; kinds in this store: bwd, fwd"
    )
    one = run_cli(two_toolchains, "ls", "--kind", "fwd")
    assert one.returncode == 0 and one.stdout.splitlines()[-1] == "1 entry"
    p = run_cli(two_toolchains, "warm", "--arch", "sm_42")
    assert p.returncode == 2 and "invalid choice: 'sm_42'" in p.stderr and "sm_100a" in p.stderr
    c = run_cli(two_toolchains, "clear", "--dry-run")
    assert c.returncode == 0 and "dry run: would remove 2 entries" in c.stdout
    assert len(list((two_toolchains / LAYOUT).glob("*/*/*.o"))) == 2


def test_ls_shows_the_spec_as_warm_names_it(tmp_path: Path) -> None:
    store = _store(tmp_path / "c")
    store.record_toolchain(OLD, {"id": OLD})
    full = {"mask": "document_window", "window": 256, "block_size": 16, "softcap": 50.0, "varlen": True}
    plain = {"mask": "document", "window": 256, "block_size": 16, "softcap": None, "varlen": False}
    _publish(store, OLD, "fwd", 1, spec=full, dtype="BFloat16")  # what older stores recorded
    _publish(store, OLD, "bwd", 2, spec=plain)
    _publish(store, OLD, "bwd_postprocess_convert", 3)  # compiled by a training call: no spec
    store.counters.add("compiles", 3)
    store.counters.add("compile_seconds", 4.5)
    store.counters.flush()
    text = run_cli(tmp_path / "c", "ls").stdout.splitlines()
    assert text[0].split() == [
        "kind",
        "digest",
        "dtype",
        "hdim",
        "mask",
        "size",
        "compile",
        "last",
        "used",
        "hits",
    ]
    fwd = next(line for line in text if line.startswith("fwd "))
    assert "bf16" in fwd and "document_window(256) softcap50 varlen" in fwd
    assert len({len(line) for line in text[:-1]}) == 1  # columns as wide as their longest cell
    rows = {r["kind"]: r for r in json.loads(run_cli(tmp_path / "c", "ls", "--json").stdout)}
    assert rows["bwd"]["spec"] == {"mask": "document", "varlen": False}
    assert rows["fwd"]["summary"]["dtype"] == "bf16" and rows["fwd"]["spec"]["window"] == 256
    assert "block_size" not in rows["fwd"]["spec"]
    st = json.loads(run_cli(tmp_path / "c", "stats", "--json").stdout)
    (host,) = st["by_host"].values()
    assert host["compiles"] == 3 and isinstance(host["compiles"], int) and host["compile_seconds"] == 4.5


def test_every_flag_has_help_and_arch_lists_its_choices() -> None:
    from fa4cache.aot.spec import MASKS
    from fa4cache.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [
        f"{name} {'/'.join(a.option_strings)}"
        for name, p in sub.choices.items()
        for a in p._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction) and not a.help
    ]
    assert missing == []
    arch = next(a for a in sub.choices["warm"]._actions if "--arch" in a.option_strings)
    assert tuple(arch.choices) == ARCHS
    mask = next(a for a in sub.choices["warm"]._actions if "--mask" in a.option_strings)
    assert tuple(mask.choices) == MASKS and all(m in mask.help for m in MASKS)
    for name in ("prune", "clear"):
        assert any("--dry-run" in a.option_strings for a in sub.choices[name]._actions)


def test_warm_table_columns_do_not_shift_with_long_names() -> None:
    from fa4cache.aot.spec import KernelSpec
    from fa4cache.cli.warm import table

    def r(err: str | None = None) -> dict[str, Any]:
        return {"compiles": 4, "present": 0, "seconds": 61.3, "compile_seconds": 38.7, "error": err}

    specs = [
        KernelSpec(),
        KernelSpec(mask="document_window", softcap=50.0, varlen=True, heads=32, heads_kv=8, head_dim=256),
        KernelSpec(mask="causal", backward=False),
    ]
    lines, failed = table([(specs[0], r()), (specs[1], r("RuntimeError: boom")), (specs[2], r())])
    assert failed == 1
    ends = {line.index("  ok") if "  ok" in line else line.index("  FAILED") for line in lines[1:]}
    assert len(ends) == 1 and lines[0].index("  status") == ends.pop()
    assert all(" 38.7 " in line and " 61.3 " in line for line in lines[1:])
