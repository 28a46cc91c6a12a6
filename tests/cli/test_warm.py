"""``fa4cache warm`` (fa4cache/cli/warm.py): what it says is what happened.

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

from fa4cache.store.paths import LAYOUT
from tests.conftest import ROOT, run_cli, worker_env
from tests.helpers.cli_stores import OLD, cli, publish_keyed


@pytest.mark.compile
def test_a_cold_warm_counts_compiles_not_hits_and_a_job_after_it_counts_its_hits(tmp_path: Path) -> None:
    from tests.conftest import run_worker

    d = tmp_path / "cache"
    manifest = tmp_path / "specs.json"
    # A forward and its backward: warm's workers look kernels up again after compiling them.
    manifest.write_text(json.dumps([{"mask": "document", "seqlen": 512}]))
    w = run_cli(d, "warm", "--manifest", str(manifest), "-j", "2")
    assert w.returncode == 0, w.stdout + w.stderr
    st = json.loads(run_cli(d, "stats", "--json").stdout)
    assert st["compiles"] == st["entries"] == 4, st
    assert (st["hits"], st["misses"], st["lock_waits"], st["hit_rate"]) == (0, 0, 0, None), st
    # A job after it: its lookups are the ones stats counts.
    r = run_worker(d, "compile", "--mask", "document", "--seqlen", "900", "--no-backward")
    assert r["compiles"] == 0 and r["disk_hits"] == 1, r
    st = json.loads(run_cli(d, "stats", "--json").stdout)
    assert st["disk_hits"] == 1 and st["misses"] == 0 and st["hit_rate"] == 1.0, st
    # Again, with --json (18): one summary on stdout for a script, the table on stderr.
    again = run_cli(d, "warm", "--manifest", str(manifest), "--json")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    (row,) = summary["specs"]
    assert (row["compiles"], row["present"], row["error"]) == (0, 4, None) and row["spec"][
        "mask"
    ] == "document"
    assert summary["failed"] is False and summary["target"]["arch"] == "sm_90"
    assert "present" in again.stderr and "1 spec, 0 kernels compiled" in again.stderr
    assert json.loads(run_cli(d, "stats", "--json").stdout)["disk_hits"] == 1  # still only the job's


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


CONFIG = {
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_size": 256,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}


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


@pytest.mark.xdist_group("cli_truth_warmed")  # one worker warms the module's store once
@pytest.mark.compile
def test_replay_honours_arch_and_names_what_it_left_out(warmed: dict[str, Any], warmed_copy: Path) -> None:
    spec = {"mask": "document", "backward": False, "seqlen": 512, "heads": 4, "arch": "sm_100"}
    publish_keyed(warmed_copy, OLD, "fwd", 1, spec=spec)
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
    publish_keyed(tmp_path / "c", OLD, "rmsnorm_fwd", 1, spec=call.to_dict())
    publish_keyed(tmp_path / "c", OLD, "fwd", 2, spec=None)  # a training call: no spec
    rep = _replay_specs(argparse.Namespace(cache_dir=str(tmp_path / "c"), arch=None))
    assert rep.jit_calls == [call] and rep.specs == [] and rep.unreplayable == 1


@pytest.mark.xdist_group("cli_truth_warmed")  # one worker warms the module's store once
@pytest.mark.compile
def test_warm_prints_no_warnings_the_user_cannot_act_on_and_shows_progress(warmed: dict[str, Any]) -> None:
    err = warmed["proc"].stderr
    assert "JitArgument" not in err and "FakeTensor" not in err, err
    assert "stored fwd kernel (" in err and "so far" in err, err  # a one-spec warm shows progress
    assert "warning" not in err.lower(), err


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
