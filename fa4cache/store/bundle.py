"""Bundles: a store's kernels in one file, for nodes that start empty.

One file, read front to back::

    magic "FA4CBUN1" | manifest length (u64 LE) | sha256 of the manifest (32 bytes)
    manifest: zlib-compressed JSON
        format, producer {user, uid, host, created, fa4cache}, toolchains {id: description},
        blobs [{sha256, size, offset, length, packed_sha256}]  content-addressed artifacts
        entries [{toolchain, kind, digest, sidecar}] each sidecar names its blob by sha256
    blobs: zlib-compressed artifacts, back to back, in manifest order; the file ends with the last

Every byte is covered by a check: the manifest by its sha256, each blob's compressed bytes by
their own sha256 (zlib ignores the padding bits of a stream's last byte, so the artifact's
checksum alone would let such a flip through), its artifact by the sha256 and size its entries'
sidecars vouch for, and the file's length by the manifest. :func:`import_bundle`
verifies every entry before it publishes any: a tampered or truncated bundle is refused whole,
naming the bad entry, and nothing of it is written. A bundle file is trusted like a base store:
owned by you, root or a uid in ``FA4CACHE_TRUSTED_UIDS``, and not writable by group or others.
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import json
import math
import os
import socket
import stat
import struct
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from fa4cache.errors import ConfigError, Fa4CacheError, InsecurePath
from fa4cache.hashing import sha256_bytes
from fa4cache.settings import BY_NAME, setting

from .paths import TOOLCHAIN_FILE, EntryRef, Layout, is_digest
from .secure_io import CLOEXEC, NOFOLLOW, NONBLOCK, only_me, owners, problem, read_checked, unlink_quiet
from .sidecar import MAX_ARTIFACT_BYTES, MAX_SIDECAR_BYTES, Sidecar, _plain
from .tiers import Artifact, Integrity, read_entry

if TYPE_CHECKING:
    from .store import Store

MAGIC = b"FA4CBUN1"
FORMAT = 2  # 2: blobs carry packed_sha256
_HEAD = struct.Struct("<8sQ32s")
_LEVEL = 6  # zlib: object files shrink ~3.5x at a few ms per MiB
_CHUNK = 1 << 20  # bytes read, and bytes inflated, at a time
ENV_MAX_SIZE = BY_NAME["FA4CACHE_BUNDLE_MAX_SIZE"].name
ENV_MAX_ENTRIES = BY_NAME["FA4CACHE_BUNDLE_MAX_ENTRIES"].name
ENV_MAX_MANIFEST = BY_NAME["FA4CACHE_BUNDLE_MAX_MANIFEST"].name
MAX_EXPANSION = 64  # artifact bytes written per byte of bundle, at most (plus the slack)
EXPANSION_SLACK = 64 << 20
MAX_PRODUCER_TEXT = 200  # a producer field is a name or a version: longer is cut


class BundleError(Fa4CacheError):
    """A bundle that cannot be used: not a bundle, tampered, truncated, or of another format."""


@dataclass(frozen=True)
class Entry:
    ref: EntryRef
    sidecar: Sidecar


@dataclass(frozen=True)
class Manifest:
    producer: dict[str, Any]
    toolchains: dict[str, dict[str, Any] | None]
    entries: tuple[Entry, ...]
    blobs: dict[str, tuple[int, int, int]]  # sha256 -> (size, offset, length)
    data_start: int
    packed: dict[str, str]  # sha256 -> sha256 of its compressed bytes


@dataclass(frozen=True)
class ExportReport:
    path: Path
    entries: int
    artifact_bytes: int  # summed uncompressed artifact sizes
    bundle_bytes: int
    toolchains: tuple[str, ...]
    skipped: tuple[str, ...] = ()  # entries that failed verification in the store

    @property
    def ratio(self) -> float:
        return self.bundle_bytes / self.artifact_bytes if self.artifact_bytes else 0.0


@dataclass(frozen=True)
class ImportReport:
    path: Path
    entries: int
    imported: int
    present: int
    busy: int
    producer: dict[str, Any] = field(default_factory=dict)
    toolchains: tuple[str, ...] = ()
    imported_refs: tuple[EntryRef, ...] = ()


# --------------------------------------------------------------------------- export


def _toolchain_description(layout: Layout, tc: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(
            read_checked(layout.toolchain_dir(tc) / TOOLCHAIN_FILE, max_bytes=1 << 16, trusted=owners())
        )
    except (OSError, ValueError, InsecurePath):
        return None
    return obj if isinstance(obj, dict) else None


def export_bundle(
    root: Path, path: Path, *, toolchains: list[str] | None = None, trusted: frozenset[int] | None = None
) -> ExportReport:
    """Write the verified entries of the store at ``root`` (of ``toolchains``, default all) to
    ``path``, atomically. Entries that fail verification are skipped and named in the report."""
    layout = Layout(root)
    trusted = only_me() if trusted is None else trusted
    tcs = layout.toolchains() if toolchains is None else [t for t in toolchains if t in layout.toolchains()]
    path = Path(path)
    entries: list[dict[str, Any]] = []
    blobs: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    skipped: list[str] = []
    raw = 0
    with tempfile.TemporaryFile(dir=path.parent or ".") as spool:
        for tc in tcs:
            for info in layout.iter_entries(toolchain=tc):
                try:
                    # Key text required: an importer refuses an entry it cannot bind to its digest.
                    art = read_entry(layout, info.ref, trusted, tier="local", require_key=True)
                except (FileNotFoundError, Integrity, InsecurePath, OSError) as e:
                    skipped.append(f"{info.ref.kind} {info.ref.digest[:16]}: {e}")
                    continue
                side = art.sidecar
                if side.sha256 not in seen:
                    packed = zlib.compress(art.data, _LEVEL)
                    seen[side.sha256] = len(blobs)
                    blobs.append(
                        {
                            "sha256": side.sha256,
                            "size": side.size,
                            "offset": spool.tell(),
                            "length": len(packed),
                            "packed_sha256": sha256_bytes(packed),
                        }
                    )
                    spool.write(packed)
                raw += side.size
                entries.append(
                    {
                        "toolchain": tc,
                        "kind": info.ref.kind,
                        "digest": info.ref.digest,
                        "sidecar": json.loads(side.to_bytes()),
                    }
                )
        from fa4cache.version import __version__

        manifest = {
            "format": FORMAT,
            "producer": {
                "user": getpass.getuser(),
                "uid": os.getuid() if hasattr(os, "getuid") else 0,
                "host": socket.gethostname(),
                "created": time.time(),
                "fa4cache": __version__,
            },
            "toolchains": {
                tc: _toolchain_description(layout, tc)
                for tc in tcs
                if any(e["toolchain"] == tc for e in entries)
            },
            "blobs": blobs,
            "entries": entries,
        }
        packed_manifest = zlib.compress(json.dumps(manifest, sort_keys=True).encode(), _LEVEL)
        tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)  # readable by the nodes that import it, writable by you only
            with os.fdopen(fd, "wb") as out:
                out.write(_HEAD.pack(MAGIC, len(packed_manifest), hashlib.sha256(packed_manifest).digest()))
                out.write(packed_manifest)
                spool.seek(0)
                while chunk := spool.read(1 << 22):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            unlink_quiet(tmp)
            raise
    return ExportReport(
        path=path,
        entries=len(entries),
        artifact_bytes=raw,
        bundle_bytes=path.stat().st_size,
        toolchains=tuple(manifest["toolchains"]),
        skipped=tuple(skipped),
    )


# --------------------------------------------------------------------------- reading


def open_bundle(path: Path, trusted: frozenset[int]) -> IO[bytes]:
    """The bundle file, opened once (no links, no FIFOs) and checked on its descriptor: a
    regular file owned by a trusted uid and not writable by group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"bundle {path} does not exist") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InsecurePath(f"bundle {path} is a symlink") from None
        raise
    # Checked on the bare descriptor: fdopen() of a directory fails with "Is a directory: 3".
    st = os.fstat(fd)
    why = None if stat.S_ISREG(st.st_mode) else f"bundle {path} is not a regular file"
    why = why or problem(st, path, trusted=trusted, what="bundle")
    if why:
        os.close(fd)
        hint = (
            " (if a trusted user made it, add their uid to FA4CACHE_TRUSTED_UIDS)"
            if "owned by" in why
            else ""
        )
        raise InsecurePath(why + hint)
    return os.fdopen(fd, "rb")


def _bad(path: Path, what: str) -> BundleError:
    return BundleError(f"bundle {path}: {what}; nothing was imported")


@dataclass(frozen=True)
class Limits:
    """What one bundle may make an importer do: every bound is checked against the manifest
    before any artifact is decompressed, so a small hostile file cannot make a large write."""

    size: int  # artifact bytes written, summed over entries
    entries: int
    manifest: int  # decompressed manifest bytes

    @classmethod
    def from_env(cls) -> Limits:
        return cls(setting(ENV_MAX_SIZE), setting(ENV_MAX_ENTRIES), setting(ENV_MAX_MANIFEST))


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e400: a float that is infinite, and no size or time
        raise ValueError(f"number {text[:40]} is not finite")
    return v


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number a bundle may hold")


def read_manifest(f: IO[bytes], path: Path, limits: Limits | None = None) -> Manifest:
    limits = Limits.from_env() if limits is None else limits
    head = f.read(_HEAD.size)
    if len(head) < _HEAD.size or not head.startswith(MAGIC[:4]):
        raise _bad(path, "not an fa4cache bundle")
    magic, mlen, msha = _HEAD.unpack(head)
    if magic != MAGIC:
        raise _bad(path, f"bundle format {magic!r} is not {MAGIC!r} (made by another fa4cache version?)")
    if mlen > limits.manifest + (1 << 20):  # zlib never grows text by more than a little
        raise _bad(path, f"manifest length {mlen} is over {ENV_MAX_MANIFEST}={limits.manifest}")
    packed = f.read(mlen)
    if len(packed) != mlen:
        raise _bad(path, "truncated inside the manifest")
    if hashlib.sha256(packed).digest() != msha:
        raise _bad(path, "the manifest does not match its checksum (damaged or tampered)")
    try:
        text = _inflate_manifest(packed, path, limits.manifest)
        obj = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
        file_size = os.fstat(f.fileno()).st_size
        return _parse_manifest(obj, _HEAD.size + mlen, limits, file_size)
    except RecursionError:
        raise _bad(path, "malformed manifest (nested deeper than any bundle is)") from None
    except (zlib.error, ValueError, TypeError, KeyError, AttributeError, ConfigError) as e:
        # OverflowError is a ValueError's sibling: _int() refuses what would raise it.
        raise _bad(path, f"malformed manifest ({str(e)[:300]})") from None


def _inflate_manifest(packed: bytes, path: Path, cap: int) -> bytes:
    """The manifest's text, inflated a chunk at a time: a bomb stops at ``cap`` bytes
    (one buffer of the cap's size would be allocated, and copied, whatever the bundle)."""
    d = zlib.decompressobj()
    parts: list[bytes] = []
    n = 0
    while packed:
        part = d.decompress(packed, _CHUNK)
        n += len(part)
        if n > cap:
            raise _bad(path, f"the manifest decompresses to over {ENV_MAX_MANIFEST}={cap} bytes")
        parts.append(part)
        packed = d.unconsumed_tail
    return b"".join(parts)


def _int(obj: Any, key: str) -> int:
    v = obj[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{key} {str(v)[:40]} is not a whole number >= 0")
    return v


def _list(obj: Any, key: str, limit: int, setting_name: str) -> list[Any]:
    v = obj[key]
    if not isinstance(v, list):
        raise ValueError(f"{key} must be a list")
    if len(v) > limit:
        raise ValueError(f"{len(v)} {key}, over {setting_name}={limit}")
    return v


def _parse_blobs(
    obj: dict[str, Any], limits: Limits
) -> tuple[dict[str, tuple[int, int, int]], dict[str, str]]:
    blobs: dict[str, tuple[int, int, int]] = {}
    packed: dict[str, str] = {}
    end = 0
    for b in _list(obj, "blobs", limits.entries, ENV_MAX_ENTRIES):
        if not isinstance(b, dict):
            raise ValueError("a blob must be an object")
        size, off, length = (_int(b, k) for k in ("size", "offset", "length"))
        sha = b["sha256"]
        if off != end or length <= 0 or not 0 < size <= MAX_ARTIFACT_BYTES or not isinstance(sha, str):
            raise ValueError("blob table out of order")
        if sha in blobs:
            raise ValueError(f"blob {sha[:16]} is listed twice")
        if not isinstance(b.get("packed_sha256"), str) or not is_digest(b["packed_sha256"]):
            raise ValueError(f"blob {sha[:16]} has no packed_sha256")
        blobs[sha] = (size, off, length)
        packed[sha] = b["packed_sha256"]
        end = off + length
    return blobs, packed


def _parse_entry(e: Any, blobs: dict[str, tuple[int, int, int]]) -> Entry:
    if not isinstance(e, dict) or not isinstance(e.get("sidecar"), dict):
        raise ValueError("an entry must be an object with a sidecar object")
    ref = EntryRef(e["toolchain"], e["kind"], e["digest"])
    name = f"{ref.kind} entry {ref.digest[:16]}"
    sidecar = Sidecar.parse(json.dumps(e["sidecar"]).encode(), ref)
    if sidecar is None:
        raise ValueError(f"{name} has an invalid sidecar")
    # Published, it gets this host's name, time and arrival: keep room for them under the limit,
    # or the store would refuse to read what the import said it imported.
    if len(sidecar.to_bytes()) > MAX_SIDECAR_BYTES - 2048:
        raise ValueError(f"{name} has a sidecar over the store's {MAX_SIDECAR_BYTES // 1024} KiB limit")
    unbound = sidecar.key_problem(required=True)
    if unbound:
        raise ValueError(f"{name}: {unbound}")
    if sidecar.sha256 not in blobs or blobs[sidecar.sha256][0] != sidecar.size:
        raise ValueError(f"{name} names no blob of its size")
    return Entry(ref, sidecar)


def _check_amplification(entries: list[Entry], limits: Limits, file_size: int) -> None:
    written = sum(e.sidecar.size for e in entries)
    if written > limits.size:
        raise ValueError(f"its entries would write {written} bytes, over {ENV_MAX_SIZE}={limits.size}")
    # Object files shrink ~3.5x; far beyond that is a zlib bomb or one blob under many keys.
    most = MAX_EXPANSION * file_size + EXPANSION_SLACK
    if written > most:
        raise ValueError(
            f"its entries would write {written} bytes, over {MAX_EXPANSION} times the bundle's "
            f"{file_size} bytes (a compression bomb?)"
        )


def _short(v: Any) -> Any:
    return v[:MAX_PRODUCER_TEXT] if isinstance(v, str) else v


def _parse_manifest(obj: Any, data_start: int, limits: Limits, file_size: int) -> Manifest:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ValueError(
            f"format {str(obj.get('format'))[:40] if isinstance(obj, dict) else '?'} is not {FORMAT} "
            "(made by another fa4cache version: export it again with this one)"
        )
    blobs, packed = _parse_blobs(obj, limits)
    entries = [_parse_entry(e, blobs) for e in _list(obj, "entries", limits.entries, ENV_MAX_ENTRIES)]
    # Imports read only the blobs entries name: another would be bytes no check covers.
    unnamed = set(blobs) - {e.sidecar.sha256 for e in entries}
    if unnamed:
        raise ValueError(f"blob {min(unnamed)[:16]} is named by no entry")
    _check_amplification(entries, limits, file_size)
    tcs = obj.get("toolchains") or {}
    producer = obj.get("producer") or {}
    if not isinstance(tcs, dict) or not isinstance(producer, dict):
        raise ValueError("toolchains and producer must be objects")
    if not all(v is None or (isinstance(v, dict) and _plain(v)) for v in tcs.values()):
        raise ValueError("a toolchain description is not plain JSON of bounded size and depth")
    return Manifest(
        producer={
            str(k)[:64]: _short(v) for k, v in list(producer.items())[:16] if isinstance(v, (str, int, float))
        },
        toolchains={str(k): (v if isinstance(v, dict) else None) for k, v in tcs.items()},
        entries=tuple(entries),
        blobs=blobs,
        data_start=data_start,
        packed=packed,
    )


def _blob_end(m: Manifest) -> int:
    return m.data_start + sum(length for _, _, length in m.blobs.values())


def _inflate(f: IO[bytes], path: Path, name: str, m: Manifest, sha: str) -> Iterator[bytes]:
    """The blob's decompressed bytes, in chunks of at most ``_CHUNK``: read and inflated a
    piece at a time, never more than its manifest size (a bomb stops there)."""
    bsize, off, length = m.blobs[sha]
    if m.data_start + off + length > os.fstat(f.fileno()).st_size:
        raise _bad(path, f"truncated: {name} ends past the end of the file")
    d = zlib.decompressobj()
    h = hashlib.sha256()
    pos, left, out = m.data_start + off, length, 0
    try:
        while left:
            packed = os.pread(f.fileno(), min(left, _CHUNK), pos)
            if not packed:
                raise _bad(path, f"truncated: {name} ends past the end of the file")
            pos, left = pos + len(packed), left - len(packed)
            h.update(packed)
            if not left and h.hexdigest() != m.packed[sha]:
                # Checked before the last chunk is inflated: bytes that differ from the ones
                # exported are refused even where zlib would inflate them to the same artifact.
                raise _bad(path, f"{name} does not match its checksum (damaged or tampered)")
            while packed:
                chunk = d.decompress(packed, _CHUNK)
                out += len(chunk)
                if out > bsize:
                    raise zlib.error(f"decompresses to more than the {bsize} bytes the manifest says")
                if chunk:
                    yield chunk
                packed = d.unconsumed_tail
        if not d.eof or d.unused_data:
            raise zlib.error("compressed stream does not end where the manifest says")
    except zlib.error as err:
        raise _bad(path, f"{name} is damaged ({err})") from None


def _first_users(m: Manifest) -> dict[str, Entry]:
    users: dict[str, Entry] = {}
    for e in m.entries:
        users.setdefault(e.sidecar.sha256, e)
    return users


def _name(e: Entry) -> str:
    return f"{e.ref.kind} entry {e.ref.digest[:16]} (toolchain {e.ref.toolchain})"


def verify_all(f: IO[bytes], path: Path, m: Manifest) -> None:
    """Check every blob against the size and checksum its entries vouch for, streaming
    (a chunk in memory at a time); raises :class:`BundleError` naming the first bad entry."""
    size = os.fstat(f.fileno()).st_size
    if size > _blob_end(m):
        raise _bad(path, f"{size - _blob_end(m)} bytes past the last artifact (damaged or appended to)")
    for sha, e in _first_users(m).items():
        h, n = hashlib.sha256(), 0
        for chunk in _inflate(f, path, _name(e), m, sha):
            h.update(chunk)
            n += len(chunk)
        if n != e.sidecar.size or h.hexdigest() != sha:
            raise _bad(path, f"{_name(e)} does not match its checksum (damaged or tampered)")


def iter_verified(f: IO[bytes], path: Path, m: Manifest) -> Iterator[tuple[Entry, bytes]]:
    """Every entry with its artifact bytes, each checked against its sidecar; one
    decompressed artifact in memory at a time. Raises :class:`BundleError` naming the first
    bad entry."""
    size = os.fstat(f.fileno()).st_size
    if size > _blob_end(m):
        raise _bad(path, f"{size - _blob_end(m)} bytes past the last artifact (damaged or appended to)")
    last: tuple[str, bytes] | None = None
    for e in m.entries:
        if last is not None and last[0] == e.sidecar.sha256:
            yield e, last[1]  # identical kernels under several keys, listed together
            continue
        last = None  # the previous blob goes before the next is inflated
        data = b"".join(_inflate(f, path, _name(e), m, e.sidecar.sha256))
        if not e.sidecar.matches(data):
            raise _bad(path, f"{_name(e)} does not match its checksum (damaged or tampered)")
        last = (e.sidecar.sha256, data)
        yield e, data


def show_bundle(path: Path, trusted: frozenset[int]) -> Manifest:
    """The manifest, after verifying every entry (nothing is written)."""
    with open_bundle(path, trusted) as f:
        m = read_manifest(f, path)
        verify_all(f, path, m)
    return m


# --------------------------------------------------------------------------- import


def publish_entries(
    store: Store, items: Iterable[tuple[EntryRef, bytes, Sidecar]], received: str
) -> tuple[list[EntryRef], int, int]:
    """Take verified ``items`` into ``store`` (:meth:`~fa4cache.store.store.Store.receive`:
    one by one under each key's lock; entries present or being compiled are skipped; all or
    nothing). Returns (the refs published, how many were present, how many busy); raises
    :class:`BundleError` if one could not be written (nothing of the bundle stays)."""
    arts = (
        Artifact(ref=ref, data=data, sidecar=sidecar, from_base=True, tier="bundle")
        for ref, data, sidecar in items
    )
    got = store.receive(arts, received=received)
    if got.failed is not None:
        raise BundleError(f"cannot write to {store.root} (see the warning above)")
    return list(got.published), got.present, got.busy


def import_bundle(store: Store, path: Path) -> ImportReport:
    """Publish every entry of the bundle at ``path`` into ``store`` (a writable
    :class:`~fa4cache.store.Store`): all verified first, then published one by one under
    each key's lock; entries already present (verified) or being compiled are skipped.

    Raises :class:`BundleError` (nothing written) or :class:`InsecurePath` (untrusted file).
    """
    if not store.writable:
        raise ConfigError(f"store {store.root} is not writable; cannot import into it")
    path = Path(path)
    with open_bundle(path, owners(store.settings.trusted_uids)) as f:
        m = read_manifest(f, path)
        verify_all(f, path, m)  # all of it, before anything is written
        for tc, desc in m.toolchains.items():
            if desc is not None and any(e.ref.toolchain == tc for e in m.entries):
                store.record_toolchain(tc, desc)
        by = f"{m.producer.get('user', '?')}@{m.producer.get('host', '?')}"
        received = f"bundle {path} made by {by}"[:1024]
        # Read again: what is published is what was checked.
        items = ((e.ref, data, e.sidecar) for e, data in iter_verified(f, path, m))
        imported, present, busy = publish_entries(store, items, received)
    return ImportReport(
        path=path,
        entries=len(m.entries),
        imported=len(imported),
        present=present,
        busy=busy,
        producer=m.producer,
        toolchains=tuple(m.toolchains),
        imported_refs=tuple(imported),
    )
