"""What filesystem a path lives on, and whether its locks can be trusted."""

from __future__ import annotations

import os
from pathlib import Path

# flock() on these is either unsupported, emulated per client, or slow and contended.
NETWORK_FS = {
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "cifs",
    "smb3",
    "smbfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "fuse.glusterfs",
    "fuse.sshfs",
    "9p",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "wekafs",
    "panfs",
}


def mount_for(path: str | os.PathLike[str], mounts_file: str = "/proc/self/mounts") -> tuple[str, str]:
    """``(mount_point, fs_type)`` of the deepest mount containing ``path``."""
    p = os.path.realpath(os.fspath(path))
    # The path may not exist yet: walk up to an existing ancestor.
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    best = ("/", "unknown")
    try:
        with open(mounts_file) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, parts[2])
    except OSError:
        pass
    return best


def is_network_fs(path: str | os.PathLike[str]) -> bool:
    return mount_for(path)[1] in NETWORK_FS


def lock_works(directory: Path, timeout: float = 5.0) -> tuple[bool, str]:
    """Try a real file lock in ``directory``: ``(ok, detail)``."""
    import filelock

    probe = directory / ".fa4cache-lockprobe.lock"
    try:
        lk = filelock.FileLock(str(probe), timeout=timeout, is_singleton=False)
        with lk:
            other = filelock.FileLock(str(probe), timeout=0, is_singleton=False)
            try:
                other.acquire()
                other.release()
                return False, "a second lock on the same file was granted: locks do not exclude"
            except filelock.Timeout:
                return True, "exclusive file locks work"
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass
