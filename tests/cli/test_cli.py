"""The CLI through subprocess, on stores filled by real (CPU) compiles."""

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
from tests.conftest import ROOT, run_cli, run_worker, start_worker


def _json(p: subprocess.CompletedProcess[str]) -> Any:
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.compile
def test_stats_json_counts_what_processes_did(doc_store_copy: Path) -> None:
    r1 = run_worker(doc_store_copy, "geometries", "--geometries", "3", "--seed", "1")
    r2 = run_worker(doc_store_copy, "geometries", "--geometries", "2", "--seed", "2")
    st = _json(run_cli(doc_store_copy, "stats", "--json"))
    assert st["entries"] == 4 and st["bytes"] == sum(
        p.stat().st_size for p in (doc_store_copy / LAYOUT).glob("*/*/*.o")
    )
    assert st["compiles"] == r1["compiles"] + r2["compiles"] == 0
    assert st["disk_hits"] == r1["disk_hits"] + r2["disk_hits"] == 8
    assert st["memory_hits"] == r1["memory_hits"] + r2["memory_hits"]
    assert st["hits"] == st["disk_hits"] + st["memory_hits"] and st["misses"] == 0
    assert st["processes"] == 2 and st["corrupt"] == 0
    for key in ("entries", "bytes", "hits", "misses", "compiles", "compile_seconds", "corrupt"):
        assert key in st
    assert set(st["by_kind"]) == {"fwd", "bwd", "bwd_preprocess", "bwd_postprocess_convert"}
    text = run_cli(doc_store_copy, "stats")
    assert text.returncode == 0 and "Hit rate" in text.stdout and "100.0 %" in text.stdout
    z = run_cli(doc_store_copy, "stats", "--zero")
    assert z.returncode == 0
    assert _json(run_cli(doc_store_copy, "stats", "--json"))["hits"] == 0


@pytest.mark.compile
def test_ls_lists_entries_with_summaries(doc_store: dict[str, Any]) -> None:
    rows = _json(run_cli(doc_store["dir"], "ls", "--json"))
    assert sorted(r["kind"] for r in rows) == ["bwd", "bwd_postprocess_convert", "bwd_preprocess", "fwd"]
    fwd = next(r for r in rows if r["kind"] == "fwd")
    assert fwd["summary"]["dtype"] == "bf16" and fwd["summary"]["head_dim"] == 128
    assert fwd["compile_seconds"] > 0 and fwd["size"] > 0
    only = _json(run_cli(doc_store["dir"], "ls", "--kind", "bwd", "--json"))
    assert [r["kind"] for r in only] == ["bwd"]
    assert "4 entries" in run_cli(doc_store["dir"], "ls").stdout


@pytest.mark.compile
def test_verify_finds_a_planted_truncated_artifact(doc_store_copy: Path) -> None:
    assert run_cli(doc_store_copy, "verify").returncode == 0
    bwd = next((doc_store_copy / LAYOUT).glob("*/bwd/*.o"))
    bwd.write_bytes(bwd.read_bytes()[:100])
    p = run_cli(doc_store_copy, "verify", "--json")
    assert p.returncode == 1
    rep = json.loads(p.stdout)
    assert [b["kind"] for b in rep["bad"]] == ["bwd"] and rep["bad"][0]["problem"] == "checksum mismatch"
    fixed = run_cli(doc_store_copy, "verify", "--repair")
    assert fixed.returncode == 0 and "quarantined" in fixed.stdout
    assert not bwd.exists() and list((doc_store_copy / "quarantine").glob("*.o"))
    assert run_cli(doc_store_copy, "verify").returncode == 0


@pytest.mark.compile
def test_prune_keeps_recent_entries_and_respects_the_cap_while_loading(doc_store_copy: Path) -> None:
    objs = {p.parent.name: p for p in (doc_store_copy / LAYOUT).glob("*/*/*.o")}
    # Age every entry but the forward kernel.
    for kind, p in objs.items():
        use = p.with_suffix(".use")
        d = json.loads(use.read_text())
        d["last_used"] = time.time() - (10 if kind == "fwd" else 90 * 86400)
        use.write_text(json.dumps(d))
    # A second process loads kernels while prune runs.
    loader = start_worker(doc_store_copy, "geometries", "--geometries", "4", "--seed", "5")
    cap = objs["fwd"].stat().st_size + 1000
    p = run_cli(doc_store_copy, "prune", "--max-size", f"{cap}B", "--yes")
    assert p.returncode == 0, p.stderr
    out, err = loader.communicate(timeout=600)
    assert loader.returncode == 0, err[-2000:]
    res = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert res["corrupt"] == 0  # never served a half-removed entry
    left = {p.parent.name for p in (doc_store_copy / LAYOUT).glob("*/*/*.o")}
    # The loader may have republished what prune removed; the fresh forward kernel stays.
    assert "fwd" in left

    def last_used() -> dict[str, float]:
        return {
            p.stem: json.loads(p.read_text())["last_used"]
            for p in (doc_store_copy / LAYOUT).glob("*/*/*.use")
        }

    before = last_used()
    newest = max(before, key=before.get)
    again = run_cli(doc_store_copy, "prune", "--max-size", f"{cap}B", "--yes")
    assert again.returncode == 0
    total = sum(p.stat().st_size for p in (doc_store_copy / LAYOUT).glob("*/*/*.o"))
    assert 0 < total <= cap
    assert newest in last_used()  # least recently used went first
    old = run_cli(doc_store_copy, "prune", "--older-than", "1d")
    assert old.returncode == 0 and "removed 0 entries" in old.stdout


@pytest.mark.compile
def test_warm_manifest_then_fresh_process_compiles_nothing_and_replay(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    manifest = tmp_path / "specs.json"
    manifest.write_text(json.dumps([{"mask": "document", "backward": False, "seqlen": 512, "heads": 4}]))
    w = run_cli(d, "warm", "--manifest", str(manifest))
    assert w.returncode == 0, w.stderr
    assert "1 kernel compiled" in w.stdout
    r = run_worker(d, "compile", "--mask", "document", "--seqlen", "900", "--no-backward")
    assert r["compiles"] == 0 and r["disk_hits"] == 1
    # Simulate a toolchain upgrade: what the store holds now belongs to an "old" toolchain.
    (tc,) = [p for p in (d / LAYOUT).iterdir() if p.is_dir()]
    old = tc.with_name("0123456789abcdef0123")
    tc.rename(old)
    for side in old.glob("*/*.json"):  # as if that toolchain had compiled them
        side.write_text(json.dumps({**json.loads(side.read_text()), "toolchain": old.name}))
    os.utime(old / "toolchain.json", (time.time() - 3 * 86400,) * 2)  # last used 3 days ago
    rep = run_cli(d, "warm", "--replay")
    assert rep.returncode == 0, rep.stderr
    assert "1 spec, 1 kernel compiled (" in rep.stdout and ", 0 failed" in rep.stdout
    assert len(list((d / LAYOUT).glob("*/*/*.o"))) == 2
    st = _json(run_cli(d, "stats", "--json"))
    current = [tc for tc, v in st["by_toolchain"].items() if v["current"]]
    assert current and current[0] != "0123456789abcdef0123"  # the most recently used one
    pr = run_cli(d, "prune", "--fingerprint", "stale", "--yes")  # half the store
    assert pr.returncode == 0 and "removed 1 entry" in pr.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prune", "--max-size", "2Q"], "cannot parse size '2Q'"),
        (["prune", "--older-than", "soon"], "cannot parse duration"),
        (["prune"], "give --max-size"),
        (["warm", "--manifest", "/nonexistent/specs.json"], "no such file"),
        (["warm", "--heads", "x:y"], "--heads"),
        (["warm", "--hf-config", "/nonexistent/config.json"], "--hf-config: cannot read"),
        (["warm", "--hf-config", "@bad-heads"], "num_attention_heads: expected a positive int"),
        (["warm", "--hf-config", "@bad-softcap"], "attn_logit_softcapping: expected a positive number"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    if "@bad-heads" in args:  # a config.json without a usable head count
        (tmp_path / "config.json").write_text('{"num_attention_heads": "16", "hidden_size": 1024}')
        args = [str(tmp_path) if a == "@bad-heads" else a for a in args]
    if "@bad-softcap" in args:
        (tmp_path / "config.json").write_text(
            '{"num_attention_heads": 4, "hidden_size": 256, "attn_logit_softcapping": -50}'
        )
        args = [str(tmp_path) if a == "@bad-softcap" else a for a in args]
    p = run_cli(d, *args)
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_bad_manifest_entry_and_missing_directory(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    m = tmp_path / "m.json"
    m.write_text(json.dumps([{"mask": "document"}, {"mask": "nope"}]))
    p = run_cli(d, "warm", "--manifest", str(m))
    assert p.returncode == 2 and "entry 1" in p.stderr and "mask" in p.stderr
    p = run_cli(tmp_path / "missing", "ls")  # as stats: a path named that holds no store is said
    assert p.returncode == 2 and "is not a store: the directory does not exist" in p.stderr


def test_clear_asks_without_yes_and_env_shell(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    (d / LAYOUT / "0123456789abcdef0123" / "fwd").mkdir(parents=True, mode=0o700)
    os.chmod(d, 0o700)
    p = run_cli(d, "clear")  # no terminal: refuses
    assert p.returncode == 2 and "--yes" in p.stderr
    assert run_cli(d, "clear", "--yes", "--all").returncode == 0
    e = run_cli(d, "env", "--shell")
    assert f"export FA4CACHE_DIR={d}" in e.stdout and "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0" in e.stdout


def test_cli_imports_no_heavy_modules(tmp_path: Path) -> None:
    code = (
        "import sys, fa4cache.cli as c; c.main(['--cache-dir', sys.argv[1], 'stats', '--json']); "
        "print(sorted(m for m in ('torch', 'cutlass', 'ray', 'flash_attn') if m in sys.modules))"
    )
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    p = subprocess.run(
        [sys.executable, "-c", code, str(d)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_doctor_reports(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    p = run_cli(d, "doctor")
    assert "file locks" in p.stdout and "exclusive file locks work" in p.stdout
    assert "flash-attn-4" in p.stdout and "filesystem" in p.stdout
    assert shutil.which("true")  # doctor exit code reflects problems; here none are fatal
    assert p.returncode == 0, p.stdout


def test_a_full_rebuild_check_fails_on_entries_it_could_not_rebuild(tmp_path: Path) -> None:
    # "Verified" means rebuilt: a job's entry records no spec, so a full `verify --rebuild`
    # cannot compile it again and must not pass it; a sample (`--rebuild N`) judges only what
    # it rebuilt, and one that rebuilt nothing verified nothing: it fails too, saying so.
    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeFA4

    root = tmp_path / "c"
    fa = FakeFA4(Store(cache_dir=root), "fwd")
    assert fa.call(1, 1) == 2
    full = run_cli(root, "verify", "--rebuild", "--json")
    out = json.loads(full.stdout)
    assert full.returncode == 1 and len(out["rebuild"]["not_rebuilt"]) == 1, (full.stdout, full.stderr)
    sample = run_cli(root, "verify", "--rebuild", "1", "--json")
    assert sample.returncode == 1, (sample.stdout, sample.stderr)


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
