"""Bytes bound to their keys on every path in, and bounded bundles.

An entry's digest is a hash of its key text. Whatever brings an entry in (a bundle, a base
store, a cluster peer: see tests/ray_integration/test_cluster.py) recomputes that hash from the sidecar's key
text and refuses an entry filed under another key, whatever its checksum says; ``verify``
reports one in the local store. The fake compiler makes the kernels: the "kernel" of key k
adds k, so a swapped entry shows as a wrong sum.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from fa4cache.hashing import encode_key, key_digest
from fa4cache.store.bundle import BundleError, export_bundle, import_bundle, show_bundle
from fa4cache.store.maintenance import verify
from fa4cache.store.paths import EntryRef, Layout
from fa4cache.store.secure_io import owners
from fa4cache.store.store import Store
from tests.conftest import run_cli
from tests.helpers.bundle_files import HEAD as _HEAD
from tests.helpers.bundle_files import rewrite_manifest
from tests.helpers.fake_compiler import TOOLCHAIN, FakeFA4


def ref_of(key: int, kind: str = "fwd") -> EntryRef:
    return EntryRef(TOOLCHAIN.id, kind, key_digest(TOOLCHAIN.id, kind, encode_key(key)))


def fill(root: Path, keys: list[int], kind: str = "fwd") -> None:
    fa = FakeFA4(Store(cache_dir=root), kind)
    assert [fa.call(k, 1) for k in keys] == [k + 1 for k in keys]


def file_under(root: Path, src: EntryRef, dst: EntryRef, *, key: str | None | bool = True) -> None:
    """What a rogue producer does: ``src``'s bytes and sidecar as the entry ``dst``, the
    sidecar's own digest field made to agree (``key``: keep its key text, or replace it)."""
    lay = Layout(root)
    side = json.loads(lay.sidecar_path(src).read_bytes())
    side["digest"] = dst.digest
    if key is not True:
        side["key"] = key
    lay.object_path(dst).write_bytes(lay.object_path(src).read_bytes())
    lay.sidecar_path(dst).write_bytes(json.dumps(side).encode())


def _swap_entry(obj: dict[str, Any], src: EntryRef, dst: EntryRef, key: Any = True) -> None:
    by_digest = {e["digest"]: e for e in obj["entries"]}
    side = dict(by_digest[src.digest]["sidecar"], digest=dst.digest)
    if key is not True:
        side["key"] = key
    by_digest[dst.digest]["sidecar"] = side


@pytest.mark.parametrize("key", [True, None, "x"], ids=["other-keys-text", "no-key-text", "bogus-text"])
def test_a_bundle_entry_with_another_keys_kernel_is_refused_by_import_and_show(
    tmp_path: Path, key: Any
) -> None:
    # The review's case: the mask=none entry carrying the causal kernel, with the causal
    # kernel's own sidecar (its checksum is right; its key text names the other key).
    fill(tmp_path / "a", [1, 2])
    f = tmp_path / "k.fa4b"
    export_bundle(tmp_path / "a", f)
    rewrite_manifest(f, lambda m: _swap_entry(m, ref_of(2), ref_of(1), key))
    want = "hashes to" if key is not None else "no key text"
    with pytest.raises(BundleError, match=want):
        show_bundle(f, owners())
    dst = tmp_path / "b"
    with pytest.raises(BundleError, match=f"fwd entry {ref_of(1).digest[:16]}.*{want}"):
        import_bundle(Store(cache_dir=dst), f)
    assert list(Layout(dst).iter_entries()) == []
    r = run_cli(dst, "bundle", "import", str(f))
    assert r.returncode == 2 and want in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_export_leaves_out_an_entry_without_key_text(tmp_path: Path) -> None:
    # Our own compiles may omit a very long key; such an entry stays in its store.
    fill(tmp_path / "a", [1, 2])
    file_under(tmp_path / "a", ref_of(1), ref_of(1), key=None)
    rep = export_bundle(tmp_path / "a", tmp_path / "k.fa4b")
    assert rep.entries == 1 and len(rep.skipped) == 1 and "no key text" in rep.skipped[0], rep
    assert import_bundle(Store(cache_dir=tmp_path / "b"), tmp_path / "k.fa4b").imported == 1


def test_verify_and_a_load_refuse_a_local_entry_filed_under_another_key(tmp_path: Path) -> None:
    root = tmp_path / "a"
    fill(root, [1, 2])
    file_under(root, ref_of(2), ref_of(1))
    store = Store(cache_dir=root)
    rep = verify(store)
    assert [b["digest"] for b in rep.bad] == [ref_of(1).digest] and "hashes to" in rep.bad[0]["problem"], rep
    r = run_cli(root, "verify")
    assert r.returncode == 1 and "hashes to" in r.stdout, r.stdout
    fa = FakeFA4(store, "fwd")
    assert fa.call(1, 1) == 2 and fa.compiles == 1  # quarantined and compiled, never 1 + 2
    assert list((root / "quarantine").glob(f"{ref_of(1).digest}.*.o"))
    assert verify(Store(cache_dir=root)).clean


@pytest.mark.parametrize("key", [True, None], ids=["other-keys-text", "no-key-text"])
def test_a_base_store_entry_filed_under_another_key_is_not_loaded(tmp_path: Path, key: Any) -> None:
    base = tmp_path / "base"
    fill(base, [1, 2])
    file_under(base, ref_of(2), ref_of(1), key=key)
    store = Store.at(tmp_path / "mine", base_dirs=[str(base)])
    assert store.load(ref_of(1)) is None and store.load(ref_of(2)) is not None
    fa = FakeFA4(store, "fwd")
    assert fa.call(1, 1) == 2 and fa.call(2, 1) == 3 and fa.compiles == 1, fa.compiles
    assert (base / "v2" / TOOLCHAIN.id / "fwd" / f"{ref_of(1).digest}.o").exists()  # a base is never repaired


# --------------------------------------------------------------------------- hostile bundles


def craft_bundle(path: Path, blobs: list[bytes], entries: list[tuple[str, int]], **extra: Any) -> None:
    """A bundle made by hand, as a hostile producer would: ``entries`` are (key text, blob
    index); every entry is bound to its key and every blob's checksum is right."""
    packed = [zlib.compress(b, 1) for b in blobs]
    table, off = [], 0
    for raw, p in zip(blobs, packed, strict=True):
        table.append(
            {
                "sha256": hashlib.sha256(raw).hexdigest(),
                "size": len(raw),
                "offset": off,
                "length": len(p),
                "packed_sha256": hashlib.sha256(p).hexdigest(),
            }
        )
        off += len(p)
    rows = []
    for key, i in entries:
        d = key_digest(TOOLCHAIN.id, "fwd", key)
        side = {
            "format": 2,
            "toolchain": TOOLCHAIN.id,
            "kind": "fwd",
            "digest": d,
            "created": 1.0,
            "key": key,
        }
        side.update(size=table[i]["size"], sha256=table[i]["sha256"])
        rows.append({"toolchain": TOOLCHAIN.id, "kind": "fwd", "digest": d, "sidecar": side})
    manifest = {"format": 2, "producer": {"user": "x"}, "toolchains": {}, "blobs": table, "entries": rows}
    manifest.update(extra)
    seal(path, json.dumps(manifest).encode(), b"".join(packed))


def seal(path: Path, text: bytes, data: bytes = b"") -> None:
    packed = zlib.compress(text, 1)
    path.write_bytes(_HEAD.pack(b"FA4CBUN1", len(packed), hashlib.sha256(packed).digest()) + packed + data)
    path.chmod(0o644)


def _malformed(tmp_path: Path) -> dict[str, Path]:
    """The review's crashing cases: sizes that overflow an int, nesting past the recursion limit."""
    good = tmp_path / "good.fa4b"
    craft_bundle(good, [b"k" * 100], [('"a"', 0)])
    text = zlib.decompress(
        good.read_bytes()[_HEAD.size :][: _HEAD.unpack(good.read_bytes()[: _HEAD.size])[1]]
    )
    out = {}
    for name, new in (
        ("infinity", text.replace(b'"size": 100, "offset"', b'"size": Infinity, "offset"', 1)),
        ("1e400", text.replace(b'"size": 100, "offset"', b'"size": 1e400, "offset"', 1)),
        ("nan-created", text.replace(b'"created": 1.0', b'"created": NaN', 1)),
        ("nested", text.replace(b'{"user": "x"}', b"[" * 200_000 + b"]" * 200_000, 1)),
        (
            "nested-toolchain",
            text.replace(b'"toolchains": {}', b'"toolchains": {"t": ' + b'{"a":' * 50 + b"1" + b"}" * 51, 1),
        ),
        ("huge-int", text.replace(b'"offset": 0', b'"offset": ' + b"9" * 5000, 1)),
        ("not-a-list", text.replace(b'"blobs": [', b'"blobs": 7, "x": [', 1)),
    ):
        assert new != text, name
        p = tmp_path / f"{name}.fa4b"
        seal(p, new, good.read_bytes()[len(good.read_bytes()) - len(zlib.compress(b"k" * 100, 1)) :])
        out[name] = p
    return out


def test_malformed_bundles_are_a_bundle_error_never_a_crash(tmp_path: Path) -> None:
    cases = _malformed(tmp_path)
    dst = tmp_path / "b"
    for p in cases.values():
        with pytest.raises(BundleError, match="malformed manifest"):
            import_bundle(Store(cache_dir=dst), p)
        with pytest.raises(BundleError):
            show_bundle(p, owners())
    for name in ("infinity", "nested"):
        r = run_cli(dst, "bundle", "import", str(cases[name]))
        assert r.returncode == 2 and "Traceback" not in r.stderr and "malformed" in r.stderr, (name, r.stderr)
    assert list(Layout(dst).iter_entries()) == []


def test_a_producer_string_is_cut_short(tmp_path: Path) -> None:
    f = tmp_path / "k.fa4b"
    craft_bundle(f, [b"k" * 100], [('"a"', 0)], producer={"user": "u" * 10_000_000, "host": "h"})
    r = run_cli(tmp_path / "b", "bundle", "show", str(f))
    assert r.returncode == 0 and len(r.stdout) < 5000 and "u" * 200 in r.stdout, len(r.stdout)


def test_a_directory_as_the_bundle_file_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for cmd in ("show", "import"):
        r = run_cli(tmp_path / "b", "bundle", cmd, str(tmp_path / "d"))
        assert (
            r.returncode == 2 and "is a directory, not a bundle file" in r.stderr and ": 3" not in r.stderr
        ), r.stderr
    # The library says it too (the CLI refuses a directory before it opens it).
    from fa4cache.errors import Fa4CacheError
    from fa4cache.store.bundle import import_bundle
    from fa4cache.store.store import Store

    with pytest.raises(Fa4CacheError, match="not a regular file"):
        import_bundle(Store.at(tmp_path / "b"), tmp_path / "d")


_MEASURE = """
import json, sys, time
from pathlib import Path
from fa4cache.store.bundle import import_bundle
from fa4cache.store.store import Store
def peak_kib():  # VmHWM: this image's own peak (ru_maxrss keeps the forking parent's across exec)
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
store = Store(cache_dir=sys.argv[1])
before = peak_kib()
t0 = time.perf_counter()
try:
    r = import_bundle(store, Path(sys.argv[2]))
    out = {"imported": r.imported}
except Exception as e:
    out = {"error": f"{type(e).__name__}: {e}"}
out.update(seconds=time.perf_counter() - t0, grew_mib=(peak_kib() - before) / 1024)
print(json.dumps(out))
"""


def measure_import(dst: Path, bundle: Path, **env: str) -> dict[str, Any]:
    """Import in a fresh process: what it says, how long it took, how much its peak RSS grew."""
    import os
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(dst), str(bundle)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FA4CACHE_DIR": str(dst), **env},
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    print(bundle.name, bundle.stat().st_size, "bytes:", out)
    return out


def _written(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.o")) if root.exists() else 0


def test_a_compression_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    # 96 MiB of zeros under 3 keys: a bundle of a few hundred KB that would write 288 MiB.
    f = tmp_path / "bomb.fa4b"
    craft_bundle(f, [bytes(96 << 20)], [(f'"k{i}"', 0) for i in range(3)])
    assert f.stat().st_size < 1 << 20
    out = measure_import(tmp_path / "b", f)
    assert "compression bomb" in out.get("error", ""), out
    assert _written(tmp_path / "b") == 0 and out["grew_mib"] < 32, out


def test_bundle_caps_name_their_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "k.fa4b"
    craft_bundle(f, [b"a" * 5000, b"b" * 5000], [(f'"k{i}"', i % 2) for i in range(4)])
    dst = tmp_path / "b"
    for var, value in (
        ("FA4CACHE_BUNDLE_MAX_ENTRIES", "3"),
        ("FA4CACHE_BUNDLE_MAX_SIZE", "19999"),
        ("FA4CACHE_BUNDLE_MAX_MANIFEST", "1K"),
    ):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(BundleError, match=var):
                import_bundle(Store(cache_dir=dst), f)
    assert list(Layout(dst).iter_entries()) == []
    assert import_bundle(Store(cache_dir=dst), f).imported == 4  # the defaults take it


def test_a_manifest_that_inflates_past_the_cap_is_refused(tmp_path: Path) -> None:
    # The review's 250 MiB manifest took 1.5 GB; a field nobody reads, 80 MiB of it.
    f = tmp_path / "big.fa4b"
    craft_bundle(f, [b"k" * 100], [('"a"', 0)], padding="p" * (80 << 20))
    out = measure_import(tmp_path / "b", f)
    assert "FA4CACHE_BUNDLE_MAX_MANIFEST" in out.get("error", "") and out["grew_mib"] < 100, out


@pytest.mark.slow
def test_import_holds_one_artifact_in_memory_at_a_time(tmp_path: Path) -> None:
    import random

    f = tmp_path / "k.fa4b"
    rng = random.Random(0)
    blobs = [rng.randbytes(16 << 20) for _ in range(8)]
    craft_bundle(f, blobs, [(f'"k{i}"', i) for i in range(8)])
    del blobs
    out = measure_import(tmp_path / "b", f)
    assert out.get("imported") == 8, out
    # One 16 MiB artifact, its copy read back by the publisher and the inflated pieces:
    # well under the 128 MiB of all eight.
    assert out["grew_mib"] < 64, out


def test_key_text_over_the_sidecar_read_limit_is_refused_at_import(tmp_path: Path) -> None:
    """Finding 6: such an entry was 'imported', then quarantined at its first load."""
    f = tmp_path / "k.fa4b"
    key = json.dumps("x" * (300 << 10))  # bound to its digest, but its sidecar is over 256 KiB
    craft_bundle(f, [b"k" * 100], [(key, 0)])
    with pytest.raises(BundleError, match="sidecar over the store's 256 KiB limit"):
        import_bundle(Store(cache_dir=tmp_path / "b"), f)
    assert list(Layout(tmp_path / "b").iter_entries()) == []


def test_a_sidecar_the_store_would_not_read_is_not_published(tmp_path: Path) -> None:
    store = Store(cache_dir=tmp_path / "s")
    key = json.dumps("x" * (300 << 10))
    ref = EntryRef(TOOLCHAIN.id, "fwd", key_digest(TOOLCHAIN.id, "fwd", key))
    assert not store.publish_bytes(ref, b"k" * 100, key=key)
    assert list(Layout(tmp_path / "s").iter_entries()) == [] and store.load(ref) is None


def test_provenance_who_compiled_where_and_how_a_copy_arrived(tmp_path: Path) -> None:
    import getpass
    import os
    import socket

    fill(tmp_path / "a", [1])
    side = Store(cache_dir=tmp_path / "a").load(ref_of(1)).sidecar
    assert side.origin is not None and side.received is None
    assert side.origin["uid"] == os.getuid() and side.origin["host"] == socket.gethostname()
    assert side.origin["user"] == getpass.getuser() and side.origin["pid"] == os.getpid()  # compiled here
    export_bundle(tmp_path / "a", tmp_path / "k.fa4b")
    import_bundle(Store(cache_dir=tmp_path / "b"), tmp_path / "k.fa4b")
    copy = Store(cache_dir=tmp_path / "b").load(ref_of(1)).sidecar
    assert copy.origin == side.origin  # who compiled it travels with every copy
    assert copy.received is not None and copy.received.startswith(f"bundle {tmp_path / 'k.fa4b'} made by ")


_HOSTILE: list[Any] = [
    None,
    True,
    -1,
    0,
    2**70,
    1.5,
    float("inf"),  # written as Infinity
    -float("inf"),
    float("nan"),
    1e308,
    "",
    "x" * 5000,
    [],
    {},
    [[[]]],
    {"a": {"b": {}}},
    "../../etc",
]


def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(obj, dict):
        return [path] + [p for k, v in obj.items() for p in _leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [path] + [p for i, v in enumerate(obj) for p in _leaves(v, (*path, i))]
    return [path]


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    obj[path[0]] = _set(obj[path[0]], path[1:], value)
    return obj


def test_every_field_of_a_manifest_replaced_by_hostile_values_is_a_bundle_error_or_harmless(
    tmp_path: Path,
) -> None:
    """Finding 4, as a battery: each field (and each object and list) of a real manifest
    replaced by each hostile value; import either refuses the bundle with a BundleError or
    imports entries that still load as the right kernels, never another exception."""
    import copy
    import random

    fill(tmp_path / "a", [1, 2])
    good = tmp_path / "good.fa4b"
    export_bundle(tmp_path / "a", good)
    blob = good.read_bytes()
    _, mlen, _ = _HEAD.unpack(blob[: _HEAD.size])
    manifest = json.loads(zlib.decompress(blob[_HEAD.size : _HEAD.size + mlen]))
    data = blob[_HEAD.size + mlen :]
    rng = random.Random(0)
    paths = _leaves(manifest)
    cases = refused = imported = 0
    bad = tmp_path / "bad.fa4b"
    for path in paths:
        for value in rng.sample(_HOSTILE, 5):
            m = _set(copy.deepcopy(manifest), path, copy.deepcopy(value))
            seal(bad, json.dumps(m).encode(), data)
            dst = tmp_path / f"d{cases}"
            cases += 1
            try:
                r = import_bundle(Store(cache_dir=dst), bad)
            except BundleError:
                refused += 1
                assert list(Layout(dst).iter_entries()) == [], path
                continue
            imported += 1
            fa = FakeFA4(Store(cache_dir=dst), "fwd")
            assert [fa.call(k, 1) for k in (1, 2)] == [2, 3], (path, value, r)
    print(f"{cases} hostile manifests ({len(paths)} fields): {refused} refused, {imported} harmless imports")
    assert refused > 0


@pytest.mark.compile
def test_verify_rebuild_finds_bytes_filed_under_their_right_key(
    tmp_path: Path, causal_fwd_store: dict[str, Any]
) -> None:
    """What the key check cannot see: another kernel's bytes under an entry's own key text
    (a producer that compiled wrong, or lied). A rebuild on this machine compares the bytes."""
    from tests.conftest import copy_store, run_worker

    root = copy_store(causal_fwd_store["dir"], tmp_path / "warm")  # the causal forward, compiled once per run
    run_worker(root, "compile", "--mask", "document", "--seqlen", "512", "--no-backward")
    # (An honest entry rebuilt is "identical": the bundle import below shows it for one.)
    # The causal kernel's bytes as the document entry, its sidecar's checksum made to agree.
    lay = Layout(root)
    doc, causal = sorted(
        lay.iter_entries(),
        key=lambda e: json.loads(lay.sidecar_path(e.ref).read_bytes())["spec"]["mask"] != "document",
    )
    side = json.loads(lay.sidecar_path(doc.ref).read_bytes())
    data = lay.object_path(causal.ref).read_bytes()
    side.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    lay.object_path(doc.ref).write_bytes(data)
    lay.sidecar_path(doc.ref).write_bytes(json.dumps(side).encode())
    assert run_cli(root, "verify").returncode == 0  # every check of the key and checksum passes
    r = run_cli(root, "verify", "--rebuild", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and [e["digest"] for e in out["rebuild"]["different"]] == [doc.ref.digest], out
    # The same through a bundle: its checks pass, the rebuild finds the bad entry, and the
    # whole bundle is refused before anything is published.
    bundle = tmp_path / "k.fa4b"
    assert export_bundle(root, bundle).entries == 2
    node = tmp_path / "node"
    r = run_cli(node, "bundle", "import", "--verify", str(bundle))
    assert r.returncode == 1 and "1 identical, 1 DIFFERENT" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "nothing was imported" in r.stdout, r.stdout
    assert Store(cache_dir=node).load(doc.ref) is None and Store(cache_dir=node).load(causal.ref) is None
