"""``fa4cache ls`` (fa4cache/cli/store_commands.py): what it lists for each kind of entry."""

from __future__ import annotations

import json
from pathlib import Path

from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Store
from tests.conftest import run_cli
from tests.helpers.cli_stores import OLD, publish


def test_ls_json_mask_is_the_mask_ls_prints(tmp_path: Path) -> None:
    store = Store.at(tmp_path / "c")
    store.record_toolchain(OLD, {"id": OLD})
    specs = {
        1: {"mask": "document", "window": 256, "block_size": 16, "softcap": None, "varlen": False},
        2: {"mask": "document_window", "window": 128, "block_size": 16, "softcap": None, "varlen": True},
        3: None,  # compiled by a training call: the summary's hash prefix
    }
    for n, spec in specs.items():
        ref = EntryRef(OLD, "fwd", f"{n}" * 64)  # digests that differ in the 12 characters ls shows
        summary = {"dtype": "bf16", "head_dim": 64, "mask": None if spec else "b2f70b3b0552"}
        assert store.publish_bytes(
            ref, b"\x7fELF" + bytes(100 + n), summary=summary, spec=spec, compile_seconds=1.0
        )
    text = run_cli(tmp_path / "c", "ls").stdout.splitlines()[1:-1]
    rows = json.loads(run_cli(tmp_path / "c", "ls", "--json").stdout)
    assert len(text) == len(rows) == 3
    shown = {line.split()[1]: line for line in text}
    for r in rows:
        line = shown[r["digest"][:12]]
        assert r["summary"]["mask"] and f" {r['summary']['mask']} " in line, (r["summary"], line)
    assert sorted(r["summary"]["mask"] for r in rows) == [
        "b2f70b3b0552",
        "document",
        "document_window(128) varlen",
    ]


def test_ls_names_generation_kernels(tmp_path: Path) -> None:
    store = Store.at(tmp_path / "c")
    store.record_toolchain(OLD, {"id": OLD})
    gen = {"heads": 4, "heads_kv": 2, "head_dim": 64, "softcap": None, "dtype": "bf16"}
    for n, window in ((1, None), (2, None), (3, 512)):
        spec = {"generation": {**gen, "window": window}, "arch": "sm_90"}
        ref = EntryRef(OLD, "fwd", f"{n}" * 64)
        assert store.publish_bytes(
            ref, b"\x7fELF" + bytes(100 + n), summary={"dtype": "bf16", "head_dim": 64}, spec=spec
        )
    lines = run_cli(tmp_path / "c", "ls").stdout.splitlines()[1:-1]
    masks = sorted(line.split()[4] for line in lines)
    assert masks == ["generation", "generation", "generation(512)"], lines
    rows = json.loads(run_cli(tmp_path / "c", "ls", "--json").stdout)
    assert sorted(r["summary"]["mask"] for r in rows) == masks


def test_ls_shows_the_spec_as_warm_names_it(tmp_path: Path) -> None:
    store = Store.at(tmp_path / "c")
    store.record_toolchain(OLD, {"id": OLD})
    full = {"mask": "document_window", "window": 256, "block_size": 16, "softcap": 50.0, "varlen": True}
    plain = {"mask": "document", "window": 256, "block_size": 16, "softcap": None, "varlen": False}
    publish(store, OLD, "fwd", 1, spec=full, dtype="BFloat16")  # what older stores recorded
    publish(store, OLD, "bwd", 2, spec=plain)
    publish(store, OLD, "bwd_postprocess_convert", 3)  # compiled by a training call: no spec
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
        "disk",
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
