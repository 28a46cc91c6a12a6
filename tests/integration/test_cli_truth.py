"""What the CLI says is what happened. warm, bundle and verify report truthfully;
errors about the store directory name the setting and the fix; the first hour has no false
alarms (warnings the user cannot act on).

The CLI runs in subprocesses. One real warm (a transformers config's kernels, with
generation's) fills a store that the warm tests copy (marked ``compile``, as is every test
that compiles); the rest write their stores through the Store API or stop before compiling.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fa4cache.hashing import encode_key, key_digest
from fa4cache.store.paths import LAYOUT, EntryRef
from fa4cache.store.store import Store
from tests.conftest import ROOT, run_cli, worker_env

OLD = "0123456789abcdef0123"  # a toolchain other than the current one
CONFIG = {
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_size": 256,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}


def cli(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``fa4cache ARGS`` as a user types it (no --cache-dir added)."""
    return subprocess.run(
        [sys.executable, "-m", "fa4cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _publish(root: Path, tc: str, kind: str, n: int, spec: Any = None) -> EntryRef:
    store = Store.at(root)
    # Filed as compiles file them: the digest is the hash of the key text it carries.
    key = encode_key((kind, n))
    ref = EntryRef(tc, kind, key_digest(tc, kind, key))
    assert store.publish_bytes(
        ref, b"\x7fELF" + bytes(200 + n), key=key, summary={"dtype": "bf16"}, spec=spec
    )
    store.record_toolchain(tc, {"arch": 90, "versions": {"flash-attn-4": "4.0.0b36"}})
    return ref


@pytest.fixture(scope="session")  # session: kept across the other modules a worker runs between its users
def warmed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``warm --hf-config --generation`` of a small model, once: its output and its store."""
    tmp = tmp_path_factory.mktemp("warmed")
    (tmp / "config.json").write_text(json.dumps(CONFIG))
    d = tmp / "cache"
    p = run_cli(d, "warm", "--hf-config", str(tmp / "config.json"), "--generation")
    assert p.returncode == 0, p.stdout + p.stderr
    return {"dir": d, "config": tmp / "config.json", "proc": p}


@pytest.fixture
def warmed_copy(warmed: dict[str, Any], tmp_path: Path) -> Path:
    dst = tmp_path / "cache"
    shutil.copytree(warmed["dir"], dst, symlinks=True)
    return dst


# ------------------------------------------------------------------ 1, 11: the store directory


def test_warm_into_a_file_or_an_unwritable_store_fails_and_saves_nothing(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    p = cli("warm", "--seqlen", "256", env=worker_env(f))
    assert p.returncode == 2, p.stdout
    assert "FA4CACHE_DIR=" in p.stderr and "is a file" in p.stderr and "unset FA4CACHE_DIR" in p.stderr
    assert "compiled" not in p.stdout
    # A store whose layout cannot be made (a file where its locks go): opened read-only.
    d = tmp_path / "store"
    d.mkdir(mode=0o700)
    (d / "locks").write_text("")
    p = run_cli(d, "warm", "--seqlen", "256")
    assert p.returncode == 2 and "kernels would not be saved" in p.stderr and "--cache-dir" in p.stderr
    assert "compiled" not in p.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode-500 directory")
def test_warm_into_a_read_only_directory_fails(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    p = run_cli(d, "warm", "--seqlen", "256")
    assert p.returncode == 2 and "not writable" in p.stderr and "compiled" not in p.stdout


@pytest.mark.parametrize("command", [["stats"], ["ls"], ["verify"], ["prune", "--older-than", "1d"]])
def test_store_directory_errors_name_the_variable_and_the_fix(tmp_path: Path, command: list[str]) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    p = cli(*command, env=worker_env(f))
    assert p.returncode == 2 and "Errno" not in p.stderr
    assert f"FA4CACHE_DIR={f} is a file, not a directory" in p.stderr and "point FA4CACHE_DIR at" in p.stderr
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    p = cli(*command, env=worker_env(tmp_path / "link"))
    assert p.returncode == 2 and f"name {real} itself" in p.stderr and "FA4CACHE_DIR" in p.stderr


def test_library_store_directory_errors_name_the_variable(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    code = (
        "import sys, fa4cache\n"
        "for call in (fa4cache.stats, fa4cache.install, fa4cache.env):\n"
        "    try:\n"
        "        call()\n"
        "    except fa4cache.ConfigError as e:\n"
        "        print(call.__name__, e)\n"
        "    else:\n"
        "        print(call.__name__, 'no error')\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=worker_env(f), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert set(lines) == {"stats", "install", "env"}
    for name, msg in lines.items():
        assert f"FA4CACHE_DIR={f} is a file, not a directory" in msg, (name, msg)
        assert "point FA4CACHE_DIR at" in msg


# ------------------------------------------------------------------ 2: bundle export


def test_bundle_export_takes_every_toolchain_or_counts_what_it_left_out(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    for i, kind in enumerate(("fwd", "bwd")):
        _publish(d, OLD, kind, i)
    current = "fedcba9876543210fedc"
    for i, kind in enumerate(("rmsnorm_fwd", "cross_entropy_fwd", "fwd"), 10):
        _publish(d, current, kind, i)
    p = run_cli(d, "bundle", "export", str(tmp_path / "all.fa4b"))
    assert p.returncode == 0, p.stderr
    assert "exported 5 entries of 2 toolchain(s)" in p.stdout and "left out" not in p.stdout
    assert f"toolchain {OLD}" in p.stdout and f"toolchain {current}" in p.stdout
    p = run_cli(d, "bundle", "export", "--current", str(tmp_path / "one.fa4b"))
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("left out"))
    other = OLD if f"toolchain {current}" in p.stdout else current
    assert f"({other})" in line and "drop --current" in line
    assert run_cli(d, "bundle", "export", "--all", str(tmp_path / "x.fa4b")).returncode == 0  # old spelling


# ------------------------------------------------------------------ 3, 5: warm's presence check


@pytest.mark.xdist_group("cli_truth_warmed")  # one worker warms the module's store once
@pytest.mark.compile
def test_default_parallel_warm_quarantines_and_recompiles_a_corrupt_entry(
    warmed: dict[str, Any], warmed_copy: Path
) -> None:
    bwd = next((warmed_copy / LAYOUT).glob("*/bwd/*.o"))
    data = bytearray(bwd.read_bytes())
    data[len(data) // 2] ^= 1
    bwd.write_bytes(bytes(data))
    assert run_cli(warmed_copy, "verify").returncode == 1
    p = run_cli(warmed_copy, "warm", "--hf-config", str(warmed["config"]), "-j", "2")
    assert p.returncode == 0, p.stderr
    assert "1 spec, 1 kernel compiled" in p.stdout, p.stdout
    v = run_cli(warmed_copy, "verify")
    assert v.returncode == 0 and ", 0 bad" in v.stdout, v.stdout
    assert list((warmed_copy / "quarantine").glob("*.o"))


@pytest.mark.xdist_group("cli_truth_warmed")  # one worker warms the module's store once
@pytest.mark.compile
def test_a_presence_check_by_warm_counts_as_last_used(warmed: dict[str, Any], warmed_copy: Path) -> None:
    old = time.time() - 3 * 86400
    for p in (warmed_copy / LAYOUT).glob("*/*/*"):
        if p.suffix == ".use":
            p.unlink()  # no use recorded: the entry's age is its file's
        else:
            os.utime(p, (old, old))
    w = run_cli(warmed_copy, "warm", "--hf-config", str(warmed["config"]), "--generation", "-j", "2")
    assert w.returncode == 0 and "1 spec, 0 kernels compiled" in w.stdout, w.stdout + w.stderr
    assert "generation: 5 kernel kinds, 0 compiled" in w.stdout, w.stdout
    p = run_cli(warmed_copy, "prune", "--older-than", "1d")
    assert p.returncode == 0 and "removed 0 entries" in p.stdout, p.stdout


# ------------------------------------------------------------------ 4: warm --replay


@pytest.mark.xdist_group("cli_truth_warmed")  # one worker warms the module's store once
@pytest.mark.compile
def test_replay_honours_arch_and_names_what_it_left_out(warmed: dict[str, Any], warmed_copy: Path) -> None:
    spec = {"mask": "document", "backward": False, "seqlen": 512, "heads": 4, "arch": "sm_100"}
    _publish(warmed_copy, OLD, "fwd", 1, spec=spec)
    p = run_cli(warmed_copy, "warm", "--replay")
    assert p.returncode == 2
    assert "`fa4cache warm --replay --arch sm_100`" in p.stderr and "--arch sm_90" in p.stderr
    p = run_cli(warmed_copy, "warm", "--replay", "--arch", "sm_90")
    assert p.returncode == 0, p.stderr
    assert "0 kernels compiled" in p.stdout and "0 failed" in p.stdout, p.stdout
    assert "left out 1 spec for sm_100: run `fa4cache warm --replay --arch sm_100`" in p.stdout
    # warm --generation's calls recorded their spec too: replayed, none left without one.
    assert "generation: 5 kernel kinds, 0 compiled" in p.stdout and "no replayable spec" not in p.stdout


def test_replay_reads_jit_specs(tmp_path: Path) -> None:
    """QuACK's kernels record their call (warm_jit records it): replay finds them."""
    import argparse

    from fa4cache.aot.jit_spec import JitCall
    from fa4cache.cli.warm import _replay_specs

    call = JitCall("quack.rmsnorm:rmsnorm_fwd", args=(1, 2), arch="sm_90", name="rmsnorm")
    _publish(tmp_path / "c", OLD, "rmsnorm_fwd", 1, spec=call.to_dict())
    _publish(tmp_path / "c", OLD, "fwd", 2, spec=None)  # a training call: no spec
    rep = _replay_specs(argparse.Namespace(cache_dir=str(tmp_path / "c"), arch=None))
    assert rep.jit_calls == [call] and rep.specs == [] and rep.unreplayable == 1


# ------------------------------------------------------------------ 7, 8, 14: what warm prints


@pytest.mark.xdist_group("cli_truth_warmed")  # one worker warms the module's store once
@pytest.mark.compile
def test_warm_prints_no_warnings_the_user_cannot_act_on_and_shows_progress(warmed: dict[str, Any]) -> None:
    err = warmed["proc"].stderr
    assert "JitArgument" not in err and "FakeTensor" not in err, err
    assert "stored fwd kernel (" in err and "so far" in err, err  # a one-spec warm shows progress
    assert "warning" not in err.lower(), err


def test_the_library_warnings_are_silenced_inside_fa4cache_only() -> None:
    import warnings

    from fa4cache.errors import quiet_library_warnings

    msg = "Argument aux_data (position 21) cannot be converted to a JitArgument for function 'f'."
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_library_warnings():
            warnings.warn(msg, UserWarning, stacklevel=1)
        warnings.warn(msg, UserWarning, stacklevel=1)  # outside: the user's own code still warns
    assert [str(w.message) for w in seen] == [msg]


# ------------------------------------------------------------------ 15, 16, 17, 18: the CLI itself


def test_version_and_cache_dir_after_the_subcommand(tmp_path: Path) -> None:
    from fa4cache import __version__

    env = worker_env(tmp_path / "unused")
    p = cli("--version", env=env)
    # fa4cache's version, then the FA4 release and whether fa4cache was verified on it.
    assert p.returncode == 0 and p.stdout.strip().startswith(f"fa4cache {__version__}; flash-attn-4 "), (
        p.stdout
    )
    d = tmp_path / "c"
    _publish(d, OLD, "fwd", 1)
    for args in (["stats", "--cache-dir", str(d), "--json"], ["--cache-dir", str(d), "stats", "--json"]):
        p = cli(*args, env=env)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["cache_dir"] == str(d) and json.loads(p.stdout)["entries"] == 1
    p = cli("bundle", "export", "--cache-dir", str(d), str(tmp_path / "b.fa4b"), env=env)
    assert p.returncode == 0 and "exported 1 entries" in p.stdout, p.stderr
    p = cli("ls", "--cache-dir", "c", env=env, cwd=tmp_path)  # relative: to where the command runs
    assert p.returncode == 0 and "1 entry" in p.stdout, p.stderr


@pytest.mark.parametrize(
    "command",
    [["stats"], ["ls"], ["verify"], ["prune", "--older-than", "1d"], ["clear", "--yes"]],
)
def test_commands_on_a_named_path_with_no_store_say_so_and_fail(tmp_path: Path, command: list[str]) -> None:
    p = run_cli(tmp_path / "not-yet", *command)
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert f"--cache-dir {tmp_path / 'not-yet'} is not a store: the directory does not exist" in p.stderr
    assert not (tmp_path / "not-yet").exists()


def test_bundle_show_on_a_directory_or_a_bad_file(tmp_path: Path) -> None:
    d = tmp_path / "c"
    p = run_cli(d, "bundle", "show", str(tmp_path))
    assert p.returncode == 2 and "is a directory, not a bundle file" in p.stderr and ": 3" not in p.stderr
    bad = tmp_path / "bad.fa4b"
    bad.write_bytes(b"not a bundle")
    p = run_cli(d, "bundle", "show", str(bad))
    assert p.returncode == 2 and "not an fa4cache bundle" in p.stderr and "imported" not in p.stderr
    p = run_cli(d, "bundle", "import", str(tmp_path))
    assert p.returncode == 2 and "is a directory, not a bundle file" in p.stderr


# ------------------------------------------------------------------ 19: masks' arguments


@pytest.mark.parametrize("arg", ["causal", "block_sparse", "validate"])
def test_mask_flags_of_the_wrong_type_are_refused(arg: str) -> None:
    import torch

    from fa4cache import make_document_mask

    with pytest.raises(TypeError, match=f"^{arg}: expected True or False, got str 'yes'"):
        make_document_mask(document_ids=torch.zeros(1, 64, dtype=torch.long), **{arg: "yes"})
    # A run of equal ids is one document: [0, 1, 0] is three; -1 is not padding.
    m = make_document_mask(document_ids=torch.tensor([[0] * 8 + [1] * 8 + [0] * 8 + [-1] * 8]))
    assert m.varlen is not None and m.varlen.calls[0].cu_seqlens_q.tolist() == [0, 8, 16, 24, 32]


# ------------------------------------------------------------------ 12: the transformers adapter

_MODEL = """
import logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(message)s")
import torch
from fa4cache.adapters import transformers as fa4t
from transformers import AutoModelForCausalLM, LlamaConfig
fa4t.register()
cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1,
                  intermediate_size=64, vocab_size=64)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4cache")
if sys.argv[1] == "forward":
    try:
        model(torch.randint(0, 64, (1, 16)), position_ids=torch.arange(16)[None])
    except Exception as e:
        print("ERROR", type(e).__name__, e)
print("DONE", time.time(), flush=True)
"""


def _model_process(tmp_path: Path, what: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, "-c", _MODEL, what],
        cwd=ROOT,
        env=worker_env(tmp_path / "cache", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    done = next(float(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("DONE"))
    return p, time.time() - max(done, t0)


def test_transformers_adapter_on_cpu_tensors_says_what_to_do(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    p, _ = _model_process(tmp_path, "forward", FA4CACHE_COMPILE_AHEAD="0")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("ERROR"))
    assert line.startswith("ERROR ValueError") and "need CUDA tensors" in line and "on cpu" in line, line
    assert "model.to('cuda')" in line


@pytest.mark.compile
def test_the_kernel_set_compiled_at_model_build_does_not_delay_exit(tmp_path: Path) -> None:
    """Building a model starts its kernel set compiling in the background; a process that
    then ends does not wait for it (it waited ~10 s, a compile, before)."""
    pytest.importorskip("transformers")
    from fa4cache.adapters.compile.task import KERNELS_PER_SPEC
    from fa4cache.adapters.transformers.model_load import specs_of_config
    from transformers import LlamaConfig

    from fa4cache.store.store import Store

    p, exit_s = _model_process(tmp_path, "build", FA4CACHE_COMPILE_AHEAD="1")
    assert "compiling the kernel set of" in p.stderr, p.stderr
    # Judged by what was stored when the process had ended, not by a clock (a loaded CI
    # machine stretches both): had the exit waited, the whole set would be there.
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1,
                      intermediate_size=64, vocab_size=64)  # fmt: skip
    kernels = sum(KERNELS_PER_SPEC[s.backward] for s in specs_of_config(cfg))
    stored = len(list(Store.at(tmp_path / "cache").entries()))
    assert kernels >= 2 and stored < kernels, f"{stored} of {kernels} kernels stored at exit ({exit_s:.1f} s)"


# ------------------------------------------------------------------ 10, 13: installing


def test_a_clone_folder_next_to_the_script_does_not_shadow_the_editable_install(tmp_path: Path) -> None:
    """python run from the parent of a clone named fa4cache (a train.py next to it): with the
    editable install alone that folder is imported as an empty namespace package."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # This environment's packages and editable install (its .pth files), as pip made them.
    (site / "parent.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    parent = tmp_path / "work"
    parent.mkdir()
    (parent / "fa4cache").symlink_to(ROOT)  # the clone, under the package's name
    code = "import fa4cache, fa4cache.adapters.compile.warm_specs; print(fa4cache.install.__name__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    fixed = subprocess.run([py, str(ROOT / "scripts" / "link_checkout.py")], capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stderr
    p = subprocess.run([py, "-c", code], cwd=parent, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "install", p.stderr
    p = subprocess.run([py, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "install", p.stderr  # from the checkout too


def test_install_script_says_what_it_is_doing(tmp_path: Path) -> None:
    """scripts/install.sh with a stand-in python3 (no downloads): a line per step, before it
    runs, and a failing step's output."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install.sh", checkout / "scripts" / "install.sh")
    stub = tmp_path / "bin"
    stub.mkdir()
    # python3 -m venv .venv makes .venv/bin/python: a stand-in that fails where FAIL_ON says.
    fake_python = '#!/bin/sh\ncase "$*" in *"$FAIL_ON"*) echo "pip: no luck" >&2; exit 1;; esac\necho fake\n'
    (stub / "python3").write_text(
        '#!/bin/sh\nmkdir -p .venv/bin\ncat > .venv/bin/python <<"X"\n' + fake_python + "X\n"
        "chmod +x .venv/bin/python\n"
    )
    (stub / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "FAIL_ON": "never"}
    p = subprocess.run(["bash", "scripts/install.sh"], cwd=checkout, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    steps = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    assert len(steps) == 5 and all(" ... done (" in ln for ln in steps), p.stdout
    assert "torch" in steps[2] and "fa4cache" in steps[3]
    p = subprocess.run(
        ["bash", "scripts/install.sh"],
        cwd=checkout,
        env={**env, "FAIL_ON": "torch=="},
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1 and "[3/5] installing torch" in p.stdout and p.stdout.rstrip().endswith("failed")
    assert "pip: no luck" in p.stderr and "install step failed" in p.stderr


def test_a_kernel_compiled_but_not_saved_is_a_failed_item() -> None:
    """warm -j 1 counts what the store did: a publish error (a full disk) fails the spec."""
    from types import SimpleNamespace

    from fa4cache.adapters.compile.warm_specs import counted

    values = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "compile_seconds": 0.0, "publish_errors": 0}
    store = SimpleNamespace(counts=lambda: dict(values))  # what warm reads of a Store

    def run() -> None:
        values["compiles"] += 1
        values["publish_errors"] += 1

    r = counted(store, lambda: None, "spec", run)
    assert r["compiles"] == 1 and r["error"] is not None and "not saved" in r["error"]


def test_parallel_warm_reports_a_kernel_compiled_but_not_stored_as_failed() -> None:
    from fa4cache.adapters.compile.parallel import merge

    from fa4cache.aot.spec import KernelSpec

    specs = [KernelSpec(mask="document"), KernelSpec(mask="causal")]
    results = [{"jobs": [["a", "b"], ["c"]], "compiled": {"a": 1.0, "c": 2.0}, "errors": {}}]
    ok, lost = merge(specs, results, 3.0, stored={"a", "b"})
    assert ok["error"] is None and ok["compiles"] == 1 and ok["present"] == 1
    assert lost["compiles"] == 1 and "not saved" in lost["error"]


@pytest.mark.compile
def test_quack_kernels_are_replayed_and_exported(tmp_path: Path) -> None:
    """QuACK's kernels live under a toolchain of their own: warm records their calls, so
    --replay compiles them again, and bundle export takes them by default."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    d = tmp_path / "cache"
    w = run_cli(
        d, "warm", "--hf-config", str(tmp_path / "config.json"), "--with-quack", "--no-backward", "-q"
    )
    assert w.returncode == 0 and "2 jit kernels, 2 compiled" in w.stdout, w.stdout + w.stderr
    r = run_cli(d, "warm", "--replay", "-q")
    assert r.returncode == 0, r.stderr
    assert "2 jit kernels, 0 compiled" in r.stdout and "1 spec, 0 kernels compiled" in r.stdout, r.stdout
    assert "no replayable spec" not in r.stdout
    e = run_cli(d, "bundle", "export", str(tmp_path / "k.fa4b"))
    assert e.returncode == 0 and "exported 3 entries of 2 toolchain(s)" in e.stdout, e.stdout
    assert "quack.rmsnorm_fwd 1" in e.stdout and "left out" not in e.stdout


@pytest.mark.xdist_group("cli_truth_warmed")  # one worker warms the module's store once
@pytest.mark.compile
def test_warm_on_a_terminal_draws_a_progress_bar(warmed: dict[str, Any], warmed_copy: Path) -> None:
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "fa4cache", "--cache-dir", str(warmed_copy), "warm"]
            + ["--hf-config", str(warmed["config"])],
            cwd=ROOT, env=worker_env(warmed_copy), stdout=subprocess.PIPE, stderr=slave, text=True, timeout=600,
        )  # fmt: skip
        os.close(slave)
        slave = -1
        err = b""
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the pty's other end is closed: all read
                break
            if not chunk:
                break
            err += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0, err
    text = err.decode(errors="replace")
    assert "\r[" in text and "1/1 specs" in text and "one line per kernel" not in text, text
