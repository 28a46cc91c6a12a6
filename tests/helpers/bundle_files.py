"""A bundle file's manifest, edited and sealed again as a producer could (tests only)."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

# magic, manifest length, manifest sha256 (the file's own header, read from outside)
HEAD = struct.Struct("<8sQ32s")


def rewrite_manifest(path: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Edit a bundle's manifest and seal it again (a valid checksum: what a producer can do)."""
    blob = path.read_bytes()
    magic, mlen, _ = HEAD.unpack(blob[: HEAD.size])
    obj = json.loads(zlib.decompress(blob[HEAD.size : HEAD.size + mlen]))
    edit(obj)
    packed = zlib.compress(json.dumps(obj).encode())
    head = HEAD.pack(magic, len(packed), hashlib.sha256(packed).digest())
    path.write_bytes(head + packed + blob[HEAD.size + mlen :])
