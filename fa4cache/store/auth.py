"""Authenticating what a job's processes hand each other through a place others can write.

The torch.distributed tier shares kernels through the job's c10d ``TCPStore``, which has no
authentication: any local user (its port is in ``/proc/net/tcp``) or any host that reaches it
can write any key. So every manifest a rank offers carries an HMAC-SHA256 under a key that
only the job's processes hold, and a rank loads only what verifies (docs/security.md).

Where the secret comes from (:func:`job_key`), first found wins:

* ``FA4CACHE_JOB_SECRET`` (16 characters or more), set in the launcher's environment: the
  ranks inherit it (torchrun, ``srun``'s default ``--export=ALL``, a Kubernetes Secret as an
  environment variable of a PyTorchJob's pods). ``/proc/<pid>/environ`` is readable by the
  same uid only.
* Otherwise a per-user secret file, ``job-secret`` (0600, 32 random bytes), in the store
  directory: every process of yours that uses that store reads the same one, so the ranks
  of a node, and of every node when the store is on a shared filesystem, agree; nobody else
  can read it. Ranks whose stores hold different secrets share nothing (each keeps to its
  own namespace of the job's store) but still compile correctly.

torchrun's run id is not used: with the static rendezvous and no ``--rdzv-id`` it is
``none``, and ``--standalone``'s random one names the rendezvous keys in the same store,
which any client can list (``TCPStore.list_keys``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from fa4cache.settings import setting
from fa4cache.store.secure_io import CLOEXEC, NOFOLLOW, only_me, open_dir, read_checked

DOMAIN = b"fa4cache job key v1"
MIN_SECRET = 16  # characters of FA4CACHE_JOB_SECRET
SECRET_FILE = "job-secret"
SECRET_BYTES = 32


@dataclass(frozen=True)
class JobKey:
    """An HMAC-SHA256 key and where its secret came from (for messages; never the secret)."""

    key: bytes = field(repr=False)
    source: str

    @property
    def id(self) -> str:
        """A public name for the key (a namespace in the shared store): reveals nothing of it."""
        return hmac.new(self.key, b"id", hashlib.sha256).hexdigest()[:16]

    def sign(self, purpose: str, *parts: bytes) -> str:
        """The hex MAC of ``parts`` for ``purpose`` (each part length-prefixed: no two
        different tuples sign alike)."""
        mac = hmac.new(self.key, purpose.encode() + b"\0", hashlib.sha256)
        for p in parts:
            mac.update(len(p).to_bytes(8, "big"))
            mac.update(p)
        return mac.hexdigest()

    def verify(self, mac: str, purpose: str, *parts: bytes) -> bool:
        return hmac.compare_digest(mac.encode(), self.sign(purpose, *parts).encode())


def from_secret(secret: bytes, source: str) -> JobKey:
    return JobKey(hmac.new(secret, DOMAIN, hashlib.sha256).digest(), source)


def job_key(root: Path) -> tuple[JobKey | None, str]:
    """This process's job key, or None and why there is none (a sentence)."""
    explicit = setting("FA4CACHE_JOB_SECRET")
    if explicit is not None:
        if len(explicit) < MIN_SECRET:
            return None, (
                f"FA4CACHE_JOB_SECRET is {len(explicit)} characters, fewer than {MIN_SECRET}: use a random "
                "one, e.g. FA4CACHE_JOB_SECRET=$(openssl rand -hex 32)"
            )
        return from_secret(explicit.encode(), "FA4CACHE_JOB_SECRET"), ""
    try:
        return from_secret(user_secret(root), f"{root / SECRET_FILE}"), ""
    except Exception as e:  # an unwritable or squatted store: no secret, no sharing
        return None, f"no per-user secret in {root} ({type(e).__name__}: {e}); set FA4CACHE_JOB_SECRET"


def user_secret(root: Path) -> bytes:
    """The secret in ``root/job-secret``, made once (0600, atomically: a reader sees the whole
    file or none) if missing. The file must be a regular file of yours that no one else can
    read; the directory is walked and checked like the store's."""
    fd = open_dir(root, leaf=only_me(), what="cache directory")
    try:
        try:
            return _read_secret(root, fd)
        except FileNotFoundError:
            pass
        tmp = f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        w = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o600, dir_fd=fd)
        try:
            os.fchmod(w, 0o600)  # whatever the umask said
            os.write(w, secrets.token_bytes(SECRET_BYTES))
            os.fsync(w)
        finally:
            os.close(w)
        try:
            os.link(tmp, SECRET_FILE, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        except FileExistsError:
            pass  # another process made it first: theirs is the one
        finally:
            os.unlink(tmp, dir_fd=fd)
        return _read_secret(root, fd)
    finally:
        os.close(fd)


def _read_secret(root: Path, fd: int) -> bytes:
    path = root / SECRET_FILE
    data = read_checked(path, max_bytes=4096, trusted=only_me(), what="job secret", dir_fd=fd)
    mode = os.stat(SECRET_FILE, dir_fd=fd, follow_symlinks=False).st_mode
    if stat.S_IMODE(mode) & 0o077 or len(data) < SECRET_BYTES:
        raise PermissionError(f"{path} is readable by others or too short: remove it (it is made again)")
    return data
