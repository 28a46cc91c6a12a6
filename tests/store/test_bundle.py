"""Bundles. One file with a manifest and content-addressed, checksummed artifacts;
import verifies everything before writing anything; a near miss says which key fields differ."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest

from fa4cache.errors import InsecurePath
from fa4cache.store.bundle import BundleError, export_bundle, import_bundle, read_manifest, show_bundle
from fa4cache.store.paths import LAYOUT, Layout
from fa4cache.store.secure_io import owners
from fa4cache.store.store import Store
from tests.conftest import run_cli, run_worker
from tests.helpers.bundle_files import rewrite_manifest
from tests.helpers.fake_compiler import TOOLCHAIN, FakeCompiled, FakeFA4, installation

KINDS = ("fwd", "bwd_preprocess", "bwd", "bwd_postprocess_convert")


def _fill(root: Path, keys: list[int], kinds: tuple[str, ...] = KINDS) -> int:
    store = Store(cache_dir=root)
    compiles = 0
    for kind in kinds:
        fa = FakeFA4(store, kind)
        assert [fa.call(k, 1) for k in keys] == [k + 1 for k in keys]
        compiles += fa.compiles
    return compiles


def _entries(root: Path) -> set[tuple[str, str, str]]:
    return {(e.ref.toolchain, e.ref.kind, e.ref.digest) for e in Layout(root).iter_entries()}


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / LAYOUT).rglob("*") if p.is_file())


def _seed() -> random.Random:
    seed = int(os.environ.get("FA4CACHE_FUZZ_SEED", "0"))
    print("FA4CACHE_FUZZ_SEED", seed)
    return random.Random(seed)


def test_export_import_into_an_empty_store_then_nothing_compiles(tmp_path: Path) -> None:
    assert _fill(tmp_path / "a", [1, 2, 3]) == 3 * len(KINDS)
    r = export_bundle(tmp_path / "a", tmp_path / "k.fa4b")
    assert r.entries == 3 * len(KINDS) and r.toolchains == (TOOLCHAIN.id,)
    imp = import_bundle(Store(cache_dir=tmp_path / "b"), tmp_path / "k.fa4b")
    assert (imp.imported, imp.present, imp.busy) == (r.entries, 0, 0)
    assert imp.producer["host"] and imp.producer["user"] and imp.toolchains == (TOOLCHAIN.id,)
    assert _entries(tmp_path / "b") == _entries(tmp_path / "a")
    assert _fill(tmp_path / "b", [1, 2, 3]) == 0  # warm: every kernel loads
    # The toolchain's description travels too (prune and the near-miss report read it).
    tc = json.loads((tmp_path / "b" / LAYOUT / TOOLCHAIN.id / "toolchain.json").read_text())
    assert tc["id"] == TOOLCHAIN.id
    again = import_bundle(Store(cache_dir=tmp_path / "b"), tmp_path / "k.fa4b")
    assert (again.imported, again.present) == (0, r.entries)


def test_exporting_again_after_more_compiles_gives_a_superset(tmp_path: Path) -> None:
    _fill(tmp_path / "a", [1, 2])
    first = export_bundle(tmp_path / "a", tmp_path / "1.fa4b")
    _fill(tmp_path / "a", [1, 2, 5], kinds=("fwd",))  # one new forward kernel
    second = export_bundle(tmp_path / "a", tmp_path / "2.fa4b")
    with open(tmp_path / "1.fa4b", "rb") as f1, open(tmp_path / "2.fa4b", "rb") as f2:
        m1, m2 = read_manifest(f1, tmp_path / "1.fa4b"), read_manifest(f2, tmp_path / "2.fa4b")
    refs1, refs2 = {e.ref for e in m1.entries}, {e.ref for e in m2.entries}
    assert refs1 < refs2 and len(refs2) == len(refs1) + 1 == second.entries == first.entries + 1


def test_a_flipped_byte_anywhere_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    rng = _seed()
    _fill(tmp_path / "a", [1, 2, 3])
    good = tmp_path / "k.fa4b"
    export_bundle(tmp_path / "a", good)
    blob = good.read_bytes()
    with open(good, "rb") as f:
        m = read_manifest(f, good)
    bad = tmp_path / "bad.fa4b"
    dst = tmp_path / "b"
    store = Store(cache_dir=dst)
    before = _files(dst)
    positions = [rng.randrange(len(blob)) for _ in range(40)]
    # And one byte in every artifact: the refusal names that entry.
    named: dict[str, Any] = {}
    for e in m.entries:  # identical bytes are stored once: the first entry that uses them is named
        named.setdefault(e.sidecar.sha256, e)
    positions += [m.data_start + off + length // 2 for _, off, length in m.blobs.values()]
    for pos in positions:
        data = bytearray(blob)
        data[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(data))
        with pytest.raises(BundleError, match="nothing was imported") as err:
            import_bundle(store, bad)
        if pos >= m.data_start:
            sha = next(s for s, (_, off, ln) in m.blobs.items() if off <= pos - m.data_start < off + ln)
            e = named[sha]
            assert f"{e.ref.kind} entry {e.ref.digest[:16]}" in str(err.value), (pos, err.value)
        assert _files(dst) == before, pos  # no entry, no temp file
    assert _entries(dst) == set()


def _exported(tmp_path: Path, keys: list[int]) -> tuple[bytes, Any, Store, Path]:
    """A bundle of ``keys``' kernels: its bytes, its manifest, an empty store to import
    into and a path for damaged copies."""
    _fill(tmp_path / "a", keys)
    good = tmp_path / "k.fa4b"
    export_bundle(tmp_path / "a", good)
    with open(good, "rb") as f:
        m = read_manifest(f, good)
    return good.read_bytes(), m, Store(cache_dir=tmp_path / "b"), tmp_path / "bad.fa4b"


def test_every_bit_of_the_last_compressed_byte_is_checked(tmp_path: Path) -> None:
    # zlib inflates a stream whose last deflate byte has a flipped padding bit to the same
    # artifact; a random flip lands there now and then (CI seed 636784824 found it).
    blob, m, store, bad = _exported(tmp_path, [1, 2])
    harmless = 0
    for _, off, length in m.blobs.values():
        pos = m.data_start + off + length - 5  # the byte before zlib's 4-byte Adler-32
        for bit in range(8):
            data = bytearray(blob)
            data[pos] ^= 1 << bit
            try:
                inflated = zlib.decompress(bytes(data[m.data_start + off : m.data_start + off + length]))
                original = zlib.decompress(blob[m.data_start + off : m.data_start + off + length])
                harmless += inflated == original
            except zlib.error:
                pass
            bad.write_bytes(bytes(data))
            with pytest.raises(BundleError, match="nothing was imported"):
                import_bundle(store, bad)
    assert harmless, "no flip inflated to the same bytes: the case this test is for did not occur"
    assert _entries(tmp_path / "b") == set()


def test_a_bundle_of_the_previous_format_is_refused_with_the_fix(tmp_path: Path) -> None:
    _fill(tmp_path / "a", [1])
    old = tmp_path / "old.fa4b"
    export_bundle(tmp_path / "a", old)

    def format_1(obj: dict[str, Any]) -> None:
        obj["format"] = 1
        for b in obj["blobs"]:
            del b["packed_sha256"]

    rewrite_manifest(old, format_1)
    with pytest.raises(BundleError, match="format 1 is not 2 .*export it again"):
        import_bundle(Store(cache_dir=tmp_path / "b"), old)


def test_a_blob_no_entry_names_is_refused(tmp_path: Path) -> None:
    # An import reads only the blobs its entries name: one more in the table (a hand-made
    # bundle) would be bytes inside the file that no check covers.
    _fill(tmp_path / "a", [1, 2])
    bad = tmp_path / "bad.fa4b"
    export_bundle(tmp_path / "a", bad)
    dropped: list[str] = []

    def drop_one_blobs_entries(obj: dict[str, Any]) -> None:
        named = {e["sidecar"]["sha256"] for e in obj["entries"]}
        assert named == {b["sha256"] for b in obj["blobs"]}
        assert len(named) > 1
        dropped.append(obj["entries"][0]["sidecar"]["sha256"])  # every entry of one blob leaves
        obj["entries"] = [e for e in obj["entries"] if e["sidecar"]["sha256"] != dropped[0]]

    rewrite_manifest(bad, drop_one_blobs_entries)
    with pytest.raises(BundleError, match=f"blob {dropped[0][:16]} is named by no entry"):
        import_bundle(Store(cache_dir=tmp_path / "b"), bad)
    assert not (tmp_path / "b").exists() or _entries(tmp_path / "b") == set()


def test_a_truncated_or_extended_bundle_is_refused_naming_the_entry(tmp_path: Path) -> None:
    rng = _seed()
    blob, m, store, bad = _exported(tmp_path, [1, 2])
    for cut in [0, 10, m.data_start - 1, *(rng.randrange(m.data_start, len(blob)) for _ in range(10))]:
        bad.write_bytes(blob[:cut])
        with pytest.raises(BundleError) as err:
            import_bundle(store, bad)
        if cut > m.data_start:
            assert "truncated:" in str(err.value) and " entry " in str(err.value), err.value
    bad.write_bytes(blob + b"\0")
    with pytest.raises(BundleError, match="past the last artifact"):
        import_bundle(store, bad)
    assert _entries(tmp_path / "b") == set()


def test_the_bundle_is_no_larger_than_its_artifacts(tmp_path: Path) -> None:
    _fill(tmp_path / "a", list(range(10)))
    r = export_bundle(tmp_path / "a", tmp_path / "k.fa4b")
    print(
        f"fake kernels: {r.entries} entries, {r.artifact_bytes} B of artifacts, bundle {r.bundle_bytes} B, {r.ratio:.3f}x"
    )
    assert r.bundle_bytes == (tmp_path / "k.fa4b").stat().st_size
    assert r.ratio <= 1.01


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the bundle file to another user")
def test_a_bundle_owned_by_an_untrusted_user_is_refused(tmp_path: Path) -> None:

    _fill(tmp_path / "a", [1])
    f = tmp_path / "k.fa4b"
    export_bundle(tmp_path / "a", f)
    os.chown(f, 65534, 65534)
    with pytest.raises(InsecurePath, match="FA4CACHE_TRUSTED_UIDS"):
        import_bundle(Store(cache_dir=tmp_path / "b"), f)
    assert _entries(tmp_path / "b") == set()
    # The same rule as base stores: name the owner, and it is trusted.
    trusting = Store.at(tmp_path / "b", trusted_uids="65534")
    assert import_bundle(trusting, f).imported == len(KINDS)
    os.chown(f, 0, 0)
    os.chmod(f, 0o666)
    with pytest.raises(InsecurePath, match="writable by group or others"):
        show_bundle(f, owners())
    os.chmod(f, 0o644)
    link = tmp_path / "link.fa4b"
    link.symlink_to(f)
    with pytest.raises(InsecurePath, match="symlink"):
        show_bundle(link, owners())


def test_cli_export_import_show(tmp_path: Path) -> None:
    _fill(tmp_path / "a", [1, 2])
    f = tmp_path / "k.fa4b"
    r = run_cli(tmp_path / "a", "bundle", "export", str(f))
    assert r.returncode == 0 and "exported 8 entries of 1 toolchain(s)" in r.stdout, r.stderr
    r = run_cli(tmp_path / "b", "bundle", "import", str(f))
    assert r.returncode == 0 and "imported 8 of 8 entries" in r.stdout and "made by" in r.stdout, r.stderr
    r = run_cli(tmp_path / "b", "bundle", "show", str(f))
    assert r.returncode == 0 and "8 entries, all verified" in r.stdout and "fwd 2" in r.stdout, r.stdout
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    r = run_cli(tmp_path / "c", "bundle", "import", str(f))
    assert r.returncode == 2 and " entry " in r.stderr and "nothing was imported" in r.stderr, r.stderr
    assert _entries(tmp_path / "c") == set()


def test_a_near_miss_says_which_key_fields_or_toolchain_differ(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fa4cache.store import nearmiss

    nearmiss._seen_kinds.clear()
    store = Store(cache_dir=tmp_path / "a")
    fa = FakeFA4(store, "fwd")
    fa.call(7, 0)
    with caplog.at_level(logging.INFO, logger="fa4cache"):
        fa.call(8, 0)  # another key of the same kind
    assert "closest key in this store differs in key: '8' here, '7' in this store" in caplog.text
    # The same key, stored for another toolchain (another FA4 version): said so, with the difference.
    from fa4cache.adapters.fa4.compile_cache import StoreCompileCache

    other = dataclasses.replace(
        TOOLCHAIN, id="fa4e00000000000000b5", versions=(("flash-attn-4", "4.0.0b35"),)
    )
    inst = installation(store)
    inst._toolchain = other
    store.record_toolchain(other.id, other.describe())
    old = StoreCompileCache("bwd", inst)
    assert 9 not in old
    old[9] = FakeCompiled(9)
    caplog.clear()
    nearmiss._seen_kinds.clear()
    new = StoreCompileCache("bwd", installation(store))
    with caplog.at_level(logging.WARNING, logger="fa4cache"):
        assert 9 not in new
    new.release_pending(9)
    assert "the same key is stored in this store for another toolchain" in caplog.text, caplog.text
    assert "versions.flash-attn-4: None here, '4.0.0b35' in this store" in caplog.text, caplog.text


@pytest.mark.compile
def test_real_kernels_bundle_small_and_warm_after_import(doc_store_copy: Path, tmp_path: Path) -> None:
    f = tmp_path / "doc.fa4b"
    r = run_cli(doc_store_copy, "bundle", "export", str(f))
    assert r.returncode == 0, r.stderr
    rep = export_bundle(doc_store_copy, tmp_path / "again.fa4b")
    print(
        f"real FA4 kernels: {rep.entries} entries, {rep.artifact_bytes} B of artifacts, "
        f"bundle {rep.bundle_bytes} B, ratio {rep.ratio:.3f}"
    )
    assert rep.entries == 4 and rep.ratio <= 1.01
    dst = tmp_path / "node"
    assert run_cli(dst, "bundle", "import", str(f)).returncode == 0
    # A node that starts empty, with only the bundle: the same training steps compile nothing.
    res = run_worker(dst, "geometries", "--geometries", "2", "--seed", "5")
    assert res["compiles"] == 0 and res["disk_hits"] == 4, res
    shutil.rmtree(dst)


def test_import_verify_refuses_what_it_could_not_rebuild_and_publishes_nothing(tmp_path: Path) -> None:
    """Issue 50: "verified" means rebuilt. A bundle whose entries record no spec (the fake
    compiler's, like any job's), or a spec that does not compile here, is refused whole by
    ``import --verify``: exit 1, the count, nothing in the store. ``--keep-unverified`` is
    the explicit way to take them anyway."""
    _fill(tmp_path / "a", [1, 2], kinds=("fwd",))
    bundle = tmp_path / "k.fa4b"
    export_bundle(tmp_path / "a", bundle)
    r = run_cli(tmp_path / "b", "bundle", "import", "--verify", str(bundle))
    assert r.returncode == 1, (r.stdout, r.stderr[-2000:])
    assert (
        "0 identical, 0 DIFFERENT, 2 not rebuilt" in r.stdout and "refused the bundle: 2 entries" in r.stdout
    )
    assert "nothing was imported" in r.stdout and "--keep-unverified" in r.stdout
    assert _entries(tmp_path / "b") == set()
    # A spec that does not compile is no better than none (one that compiles another kernel:
    # tests/store/test_bytes_bound_to_keys.py::test_verify_rebuild_finds_bytes_filed_under_their_right_key).
    wrong = tmp_path / "wrong.fa4b"

    def name_a_spec(m: dict[str, Any]) -> None:
        for e in m["entries"]:
            e["sidecar"]["spec"] = {"dtype": "fp64"}

    shutil.copy(bundle, wrong)
    rewrite_manifest(wrong, name_a_spec)
    r = run_cli(tmp_path / "b", "bundle", "import", "--verify", str(wrong))
    assert r.returncode == 1 and "2 not rebuilt" in r.stdout and "the rebuild failed" in r.stdout, r.stdout
    assert _entries(tmp_path / "b") == set()
    # Asked for by name: imported, and said so.
    r = run_cli(tmp_path / "b", "bundle", "import", "--verify", "--keep-unverified", str(bundle))
    assert r.returncode == 0 and "imported 2 of 2" in r.stdout and "2 NOT verified" in r.stdout, r.stdout
    assert len(_entries(tmp_path / "b")) == 2
    assert run_cli(tmp_path / "c", "bundle", "import", "--keep-unverified", str(bundle)).returncode == 2


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated"])
def test_a_failed_import_leaves_no_store_behind(tmp_path: Path, damage: str) -> None:
    # A newcomer's mistyped or broken bundle: refused, and the store it named is not created.
    from fa4cache.store.bundle import export_bundle
    from fa4cache.store.store import Store
    from tests.conftest import run_cli
    from tests.helpers.fake_compiler import FakeFA4

    src = tmp_path / "src"
    FakeFA4(Store(cache_dir=src), "fwd").call(1, 1)
    good = tmp_path / "good.fa4b"
    export_bundle(src, good)
    bad = tmp_path / "bad.fa4b"
    if damage == "empty":
        bad.write_bytes(b"")
    elif damage == "truncated":
        bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    target = tmp_path / "new-store"
    r = run_cli(target, "bundle", "import", str(bad))
    assert r.returncode != 0, r.stdout
    assert not target.exists(), sorted(str(p) for p in target.rglob("*"))
