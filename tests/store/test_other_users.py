"""The adversarial review's attacks, one test each, with a victim and an attacker.

Both are unprivileged users that the tests create (CI runs as root); the victim runs the
store and the CLI in its own processes, the attacker prepares or races the directories.
Skipped, with the reason, where users cannot be created. Entries are made with the fake
compiler (tests/helpers/fake_compiler.py): what is under test is the store, its trust checks
and the CLI, not cute.compile.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

VICTIM, ATTACKER = "fa4victim", "fa4attacker"
# What the users' code imports; loaded before each fork (see User).
PRELOAD = (
    "argparse", "getpass", "resource", "filelock", "fa4cache.cli", "fa4cache.store.maintenance", "fa4cache.store.stats",
    "fa4cache.store.fsinfo", "fa4cache.aot.spec", "tests.helpers.fake_compiler", "encodings.idna",
)  # fmt: skip
pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root to create the victim and attacker users (CI runs as root)",
)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class User:
    """Runs code as another user: in a child forked from a clean server process
    (:mod:`tests.helpers.as_user`) that drops root after the fork.

    The interpreter lives where the other users cannot read it (a venv under /root), so
    everything the code needs is imported by the server before it forks (see
    :data:`PRELOAD`) and the child only switches uid, environment and umask.
    """

    def __init__(self, name: str, home: Path, preload: tuple[str, ...] = PRELOAD) -> None:
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, pw.pw_uid, pw.pw_gid, home
        self.preload = preload  # the modules of the server this user's code is forked from

    def run(
        self, code: str, *, env: dict[str, str] | None = None, timeout: float = 60, umask: int = 0o022
    ) -> Result:
        """Run Python ``code`` as this user; its exit status, stdout and stderr."""
        reply = _server_request(self._request(code, env, timeout, umask), self.preload)
        if reply.get("timeout"):
            raise TimeoutError(f"code run as {self.name} did not finish in {timeout} s")
        return Result(reply["returncode"], reply["stdout"], reply["stderr"])

    def _request(self, code: str, env: dict[str, str] | None, timeout: float, umask: int) -> dict[str, Any]:
        return {
            "code": code,
            "uid": self.uid,
            "gid": self.gid,
            "home": str(self.home),
            "umask": umask,
            "timeout": timeout,
            "env": {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, **(env or {})},
        }

    def start(self, code: str, env: dict[str, str] | None = None) -> int:
        """Start Python ``code`` as this user in the background; its pid (kill it when done)."""
        req = self._request(code, env, 0, 0o022) | {"background": True}
        return int(_server_request(req, self.preload)["pid"])

    def cli(
        self, cache_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> Result:
        argv = ["--cache-dir", str(cache_dir), *args]
        return self.run(
            f"import sys; from fa4cache.cli import main; sys.exit(main({argv!r}))", env=env, timeout=timeout
        )


# One server per set of preloaded modules (the CuTe DSL is preloaded only where kernels load).
_SERVERS: dict[tuple[str, ...], subprocess.Popen[str]] = {}


def _server_request(req: dict[str, Any], preload: tuple[str, ...] = PRELOAD) -> dict[str, Any]:
    if preload not in _SERVERS:
        root = Path(__file__).resolve().parents[2]
        _SERVERS[preload] = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.as_user", json.dumps(preload)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    server = _SERVERS[preload]
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(json.dumps(req) + "\n")
    server.stdin.flush()
    line = server.stdout.readline()
    if not line:
        raise RuntimeError(f"the run-as-user server exited ({server.wait()})")
    return json.loads(line)


@pytest.fixture(scope="module")
def people() -> Iterator[tuple[User, User, Path]]:
    base = Path(tempfile.mkdtemp(prefix="fa4sec-", dir="/tmp"))
    os.chmod(base, 0o755)
    users = []
    for name in (VICTIM, ATTACKER):
        subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], capture_output=True)
        home = base / name
        home.mkdir(mode=0o700)
        u = User(name, home)
        os.chown(home, u.uid, u.gid)
        users.append(u)
    yield users[0], users[1], base
    shutil.rmtree(base, ignore_errors=True)
    while _SERVERS:
        _, server = _SERVERS.popitem()
        server.communicate(timeout=30)  # stdin closed: the server's loop ends


def _seed(user: User, root: Path, keys: tuple[int, ...] = (1,), env: dict[str, str] | None = None) -> None:
    """Compile ``keys`` with the fake compiler into the store at ``root``, as ``user``."""
    p = user.run(
        f"""
        from fa4cache.settings import Settings
        from fa4cache.store import Store
        from tests.helpers.fake_compiler import FakeFA4
        fa = FakeFA4(Store(Settings.from_env({str(root)!r})))
        for k in {keys!r}:
            fa.call(k, 0)
        """,
        env=env,
    )
    assert p.returncode == 0, p.stderr


def _probe(
    user: User, root: Path, key: int = 1, env: dict[str, str] | None = None, timeout: float = 60
) -> dict[str, Any]:
    """As ``user``: call the fake kernel ``key`` once; how many compiles and what the store counted."""
    p = user.run(
        f"""
        import json
        from fa4cache.settings import Settings
        from fa4cache.store import Store
        from tests.helpers.fake_compiler import FakeFA4
        store = Store(Settings.from_env({str(root)!r}))
        fa = FakeFA4(store)
        fa.call({key}, 0)
        print("RESULT", json.dumps({{"compiles": fa.compiles, "root": str(store.root), **store.counters.values}}))
        """,
        env=env,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.split("RESULT ", 1)[1])


def _objects(root: Path) -> list[Path]:
    return sorted(root.glob("v2/*/*/*.o"))


# --------------------------------------------------------------------------- high


def test_store_under_a_directory_others_can_write_is_refused(people: Any) -> None:
    victim, _, base = people
    proj = base / "proj"
    proj.mkdir()
    os.chmod(proj, 0o777)  # group-shared project directory, not sticky
    p = victim.run(
        f"""
        from fa4cache.settings import Settings
        from fa4cache.store import Store
        Store(Settings.from_env({str(proj / "fa4cache-victim")!r}))
        """
    )
    assert p.returncode != 0 and "InsecurePath" in p.stderr and "writable by group or others" in p.stderr


def test_the_loader_gets_the_verified_bytes_not_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cutlass.cute as cute
    from fa4cache.adapters.fa4.artifacts import load_callable

    from fa4cache.store.store import Store
    from tests.helpers.fake_compiler import FakeFA4

    store = Store.at(tmp_path / "c")
    FakeFA4(store).call(1, 0)
    (e,) = list(store.layout.iter_entries())
    art = store.load(e.ref)
    assert art is not None
    # Between the check and the load, the path now names other bytes (a swapped tree).
    store.layout.object_path(e.ref).write_bytes(b"attacker's object file" * 50)
    seen = []

    class Module:
        func = "loaded"

    def fake_load_module(path: str, enable_tvm_ffi: bool) -> Module:  # the DSL's loader
        seen.append(Path(path).read_bytes())
        return Module()

    monkeypatch.setattr(cute.runtime, "load_module", fake_load_module)
    assert load_callable(art) == "loaded"
    assert seen == [art.data]


def test_directories_are_private_whatever_the_umask(people: Any) -> None:
    victim, _, _ = people
    root = victim.home / "deep" / "er" / "cache"
    p = victim.run(
        f"""
        from fa4cache.settings import Settings
        from fa4cache.store import Store
        Store(Settings.from_env({str(root)!r}))
        """,
        umask=0o002,
    )
    assert p.returncode == 0, p.stderr
    for d in (victim.home / "deep", victim.home / "deep" / "er", root, root / "v2", root / "locks"):
        assert d.stat().st_mode & 0o777 == 0o700, d


def test_trust_shared_is_gone_and_a_world_writable_base_is_refused(people: Any) -> None:
    victim, attacker, base = people
    shared = base / "team-base"
    _seed(User("root", Path("/root")), shared)  # an admin's entries, in a directory open to all
    for p in shared.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chmod(shared, 0o777)
    planted = attacker.run(f"open({str(shared / 'planted')!r}, 'w').write('x')")
    assert planted.returncode == 0, planted.stderr  # anyone can write there: the attack's premise
    p = victim.run(
        "from fa4cache.settings import Settings; Settings.from_env('/tmp/x')",
        env={"FA4CACHE_TRUST_SHARED": "1"},
    )
    assert p.returncode != 0 and "FA4CACHE_TRUSTED_UIDS" in p.stderr
    local = victim.home / "local1"
    r = _probe(victim, local, env={"FA4CACHE_BASE_DIRS": str(shared), "FA4CACHE_INSECURE": "warn"})
    assert r["compiles"] == 1 and r["disk_hits"] == 0


def test_a_trusted_owners_base_with_an_attacker_owned_directory_is_refused(people: Any) -> None:
    victim, attacker, base = people
    admin_base = base / "admin-base"
    r0 = _probe(victim, victim.home / "scratch")  # learn nothing but that probing works
    assert r0["compiles"] == 1
    root_user = User("root", Path("/root"))
    _seed(root_user, admin_base)
    os.chmod(admin_base, 0o755)
    for p in admin_base.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    # The attacker owns the kind directory of an admin-owned base store.
    (kind_dir,) = {p.parent for p in _objects(admin_base)}
    os.chown(kind_dir, attacker.uid, attacker.gid)
    r = _probe(victim, victim.home / "local2", env={"FA4CACHE_BASE_DIRS": str(admin_base)})
    assert r["compiles"] == 1 and r["disk_hits"] == 0 and r["insecure"] >= 1
    # With the directory back in the admin's hands, the same base is used (root is trusted).
    os.chown(kind_dir, 0, 0)
    r = _probe(victim, victim.home / "local3", env={"FA4CACHE_BASE_DIRS": str(admin_base)})
    assert r["compiles"] == 0 and r["disk_hits"] == 1


def test_a_fifo_sidecar_in_a_trusted_base_does_not_block(people: Any) -> None:
    victim, _, base = people
    admin_base = base / "fifo-base"
    _seed(User("root", Path("/root")), admin_base)
    os.chmod(admin_base, 0o755)
    for p in admin_base.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    (obj,) = _objects(admin_base)
    side = obj.with_suffix(".json")
    side.unlink()
    os.mkfifo(side, 0o644)
    t0 = time.monotonic()
    r = _probe(victim, victim.home / "local4", env={"FA4CACHE_BASE_DIRS": str(admin_base)}, timeout=30)
    assert r["compiles"] == 1 and time.monotonic() - t0 < 30


# --------------------------------------------------------------------------- medium


def test_a_squatted_node_local_default_falls_back_to_the_private_cache(people: Any) -> None:
    victim, attacker, _ = people
    squat = Path(f"/var/tmp/fa4cache-{victim.name}")
    shutil.rmtree(squat, ignore_errors=True)
    squat.mkdir(mode=0o700)
    os.chown(squat, attacker.uid, attacker.gid)
    try:
        r = _probe(victim, Path("/var/tmp/fa4cache-{user}"))
        assert r["root"] == str(victim.home / ".cache" / "fa4cache") and r["compiles"] == 1
    finally:
        shutil.rmtree(squat, ignore_errors=True)


def test_stats_never_follows_a_symlinked_stats_directory(people: Any) -> None:
    victim, attacker, base = people
    mine = victim.home / "store5"
    _seed(victim, mine)
    keep = mine / "stats" / "run~final.json"
    keep.write_text(json.dumps({"host": "h", "counters": {"compiles": 1}, "updated": 0}))
    os.chown(keep, victim.uid, victim.gid)
    archive_before = (mine / "stats").iterdir()
    names_before = sorted(p.name for p in archive_before)
    theirs = base / "attacker-store"
    theirs.mkdir()
    (theirs / "stats").symlink_to(mine / "stats")
    os.chown(theirs, attacker.uid, attacker.gid)
    os.lchown(theirs / "stats", attacker.uid, attacker.gid)
    p = victim.cli(theirs, "stats")
    # Refused at the attacker's store directory already (the CLI checks the store
    # like Store() does), before its stats/ link is looked at.
    assert p.returncode == 2 and "Traceback" not in p.stderr and "owned by uid" in p.stderr
    assert sorted(p.name for p in (mine / "stats").iterdir()) == names_before and keep.exists()


def test_a_fifo_counters_file_does_not_hang_stats(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store6"
    _seed(victim, mine)
    fifo = mine / "stats" / "otherhost~1~abcd.json"
    os.mkfifo(fifo, 0o600)
    os.chown(fifo, victim.uid, victim.gid)
    p = victim.cli(mine, "stats", timeout=30)
    assert p.returncode == 0, p.stderr


# --------------------------------------------------------------------------- low


@pytest.mark.parametrize("hostile", ["directory", "foreign file"])
def test_hostile_lock_files_do_not_stop_prune_or_clear(people: Any, hostile: str) -> None:
    victim, attacker, _ = people
    mine = victim.home / f"store7-{hostile.replace(' ', '')}"
    _seed(victim, mine, keys=(1, 2))
    e = _objects(mine)[0]
    lock = mine / "locks" / f"{e.stem}.lock"
    lock.unlink(missing_ok=True)
    if hostile == "directory":
        lock.mkdir()
    else:
        lock.write_text("")
        os.chown(lock, attacker.uid, attacker.gid)
    for args in (("prune", "--max-size", "0B", "--yes"), ("clear", "--yes")):
        p = victim.cli(mine, *args)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert "could not remove" in p.stdout and "lock file" in p.stdout
    assert [x.name for x in _objects(mine)] == [e.name]  # the other entry went


def test_clear_does_not_wait_for_held_keys_and_says_so(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store8"
    _seed(victim, mine, keys=(1, 2, 3))
    held = victim.home / "store8-held"
    # Forked from the clean server, not from pytest (see tests/helpers/as_user.py): holds the three
    # keys' locks, as the victim, until killed.
    pid = victim.start(
        f"""
        import pathlib, time, filelock
        held = [filelock.FileLock(str(p)) for p in pathlib.Path({str(mine / "locks")!r}).glob("*.lock")]
        for lk in held:
            lk.acquire()
        pathlib.Path({str(held)!r}).write_text(str(len(held)))
        time.sleep(120)
        """
    )
    try:
        deadline = time.monotonic() + 30
        while not (held.exists() and held.read_text() == "3") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.exists() and held.read_text() == "3", "the lock holder did not take the three locks"
        t0 = time.monotonic()
        p = victim.cli(mine, "clear", "--yes", env={"FA4CACHE_LOCK_TIMEOUT": "600"}, timeout=30)
        assert time.monotonic() - t0 < 20
        assert p.returncode == 1 and "removed 0 entries" in p.stdout and "skipped 3" in p.stdout
    finally:
        os.kill(pid, 9)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("prune", "--max-size", "9" * 25 + "P"), {}, "--max-size"),
        (("stats",), {"FA4CACHE_MAX_SIZE": "9" * 25 + "P"}, "FA4CACHE_MAX_SIZE"),
        (("stats",), {"FA4CACHE_LOCK_TIMEOUT": "nan"}, "FA4CACHE_LOCK_TIMEOUT"),
    ],
)
def test_absurd_numbers_are_one_clear_line(
    people: Any, args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    victim, _, _ = people
    mine = victim.home / "store9"
    _seed(victim, mine)
    p = victim.cli(mine, *args, env=env)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_sidecars_with_wrong_field_types_do_not_crash_ls(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store10"
    _seed(victim, mine)
    (obj,) = _objects(mine)
    side = obj.with_suffix(".json")
    d = json.loads(side.read_text())
    d.update(summary=5, compile_seconds="slow", created=[1], spec="x")
    side.write_text(json.dumps(d))
    p = victim.cli(mine, "ls", "--json")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    assert row["valid_sidecar"] is False


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("archive.json", '{"merged": 5, "by_host": {"h": {"counters": {"compiles": 1}}}}'),
        ("archive.json", '{"by_host": {"h": {"counters": {"compiles": 1e999}}}}'),
        ("archive.json", '{"by_host": [1, 2], "processes": "many"}'),
        ("h~1~a.json", '{"counters": [], "by_kind": {"fwd": [1]}, "host": {"x": 1}}'),
        ("h~1~b.json", "[" * 400_000 + "]" * 400_000),
        (
            "h~1~c.json",
            '{"counters": {"compiles": 2}, "by_kind": {"\\u001b[31mevil": {"compiles": 1}}, "host": "\\u001b]0;x\\u0007"}',
        ),
    ],
)
def test_damaged_counters_files_do_not_crash_stats(people: Any, name: str, content: str) -> None:
    victim, _, _ = people
    mine = victim.home / f"store11-{abs(hash(content)) % 10**6}"
    _seed(victim, mine)
    f = mine / "stats" / name
    f.write_text(content)
    os.chown(f, victim.uid, victim.gid)
    for args in (("stats",), ("stats", "--json")):
        p = victim.cli(mine, *args)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "\x1b" not in p.stdout and "\x07" not in p.stdout


def test_an_infinite_last_use_does_not_make_an_entry_unprunable(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store12"
    _seed(victim, mine)
    (obj,) = _objects(mine)
    obj.with_suffix(".use").write_text('{"last_used": Infinity, "hits": 3}')
    os.utime(obj, (time.time() - 40 * 86400,) * 2)
    p = victim.cli(mine, "prune", "--older-than", "30d", "--yes")
    assert p.returncode == 0 and "removed 1 entry" in p.stdout, p.stdout + p.stderr


def test_a_fifo_artifact_does_not_hang_verify(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store13"
    _seed(victim, mine)
    (obj,) = _objects(mine)
    obj.unlink()
    os.mkfifo(obj, 0o600)
    os.chown(obj, victim.uid, victim.gid)
    p = victim.cli(mine, "verify", timeout=30)
    assert p.returncode == 1 and "not a regular file" in p.stdout


def test_repair_never_deletes_through_a_symlinked_kind_directory(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store14"
    _seed(victim, mine)
    (obj,) = _objects(mine)
    kind_dir = obj.parent
    target = victim.home / "precious"
    kind_dir.rename(target)
    kind_dir.symlink_to(target)
    os.lchown(kind_dir, victim.uid, victim.gid)
    before = sorted(p.name for p in target.iterdir())
    p = victim.cli(mine, "verify", "--repair")
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(p.name for p in target.iterdir()) == before


def _mount_tmpfs(path: Path, opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_stats_on_a_full_disk_and_repair_on_a_read_only_store(people: Any) -> None:
    victim, _, base = people
    mnt = base / "mnt"
    if not _mount_tmpfs(mnt, f"size=256k,mode=0755,uid={victim.uid},gid={victim.gid}"):
        pytest.skip("cannot mount a tmpfs here: a full or read-only disk cannot be made")
    try:
        store = mnt / "store"
        _seed(victim, store)
        # Fill the disk, with a dead process's counters file waiting to be compacted.
        dead = store / "stats" / "h~4000001~z.json"
        dead.write_text(json.dumps({"host": "h", "pid": 4000001, "updated": 0, "counters": {"compiles": 1}}))
        os.chown(dead, victim.uid, victim.gid)
        filler = victim.run(f"open({str(mnt / 'fill')!r}, 'wb').write(b'x' * (1 << 20))")
        assert "No space left" in filler.stderr
        p = victim.cli(store, "stats")
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        # Read-only: a bad entry that repair cannot move is reported, not "fixed".
        (obj,) = _objects(store)
        obj.write_bytes(b"damaged")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        p = victim.cli(store, "verify", "--repair")
        assert p.returncode == 1 and "not repaired" in p.stdout, p.stdout + p.stderr
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_running_out_of_file_descriptors_quarantines_nothing(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store15"
    _seed(victim, mine)
    p = victim.run(
        f"""
        import os, resource
        from fa4cache.settings import Settings
        from fa4cache.store import Store
        store = Store(Settings.from_env({str(mine)!r}))
        (e,) = list(store.layout.iter_entries())
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        assert store.load(e.ref) is None
        for fd in held:
            os.close(fd)
        assert not list(store.layout.quarantine_dir.iterdir())
        assert store.load(e.ref) is not None
        print("ok")
        """
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


# --------------------------------------------------------------------------- fourth review

DSL_PRELOAD = (
    *PRELOAD,
    "tests.helpers.cute_preload",
    "tests.helpers.dsl_probe",
    "tests.helpers.dsl_probe_evil",
    "fa4cache.adapters.install",
)
_SQUAT = """
import ctypes, os
from pathlib import Path
d = Path({cache!r})
d.mkdir(parents=True)
os.chmod(d.parent, 0o777)
os.chmod(d, 0o777)
from tests.helpers import dsl_probe, dsl_probe_evil
dsl_probe.hello(41)  # the victim's function, compiled with the victim's environment: its file name
names = set(os.listdir(d))
dsl_probe_evil.hello(41)
(evil,) = set(os.listdir(d)) - names
for n in names:
    (d / n).write_bytes((d / evil).read_bytes())
    os.chmod(d / n, 0o644)
ctypes.CDLL(None).fflush(None)
"""
_VICTIM_CALL = """
import ctypes, os
{install}
from tests.helpers import dsl_probe
dsl_probe.hello(41)
ctypes.CDLL(None).fflush(None)
"""


@pytest.mark.compile
def test_a_squatted_cute_dsl_cache_is_never_read(people: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3: the DSL keeps IR under $TMPDIR/$USER/cutlass_python_cache, made without an
    ownership check and checked by CRC32 only. The attacker makes the victim's directory first
    and files its own function's IR under the name of the victim's: without fa4cache the
    victim's host-side @cute.jit call runs the attacker's code; after fa4cache.install() (the
    DSL already imported, as in a process that imported it first) it never reads that cache."""
    victim, attacker, base = people
    victim, attacker = (
        User(victim.name, victim.home, DSL_PRELOAD),
        User(attacker.name, attacker.home, DSL_PRELOAD),
    )
    monkeypatch.delenv("CUTE_DSL_DISABLE_FILE_CACHING", raising=False)  # the servers inherit this
    shared = base / "shared-tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    env = {"TMPDIR": str(shared), "CUTE_DSL_ARCH": "sm_90a"}
    cache = shared / victim.name / "cutlass_python_cache"
    p = attacker.run(_SQUAT.format(cache=str(cache)), env={**env, "USER": victim.name}, timeout=300)
    assert p.returncode == 0 and "PWNED 42" in p.stdout, p.stderr[-3000:]
    assert cache.stat().st_uid == attacker.uid
    before = victim.run(_VICTIM_CALL.format(install=""), env=env, timeout=300)
    assert before.stdout.strip() == "PWNED 42", before  # the attack works in this setup
    mine = victim.home / "store-dsl"
    install = f"from fa4cache.adapters.install import install; install({str(mine)!r}, compile_server=False)"
    after = victim.run(_VICTIM_CALL.format(install=install), env=env, timeout=300)
    assert after.returncode == 0 and after.stdout.strip() == "sum 42", after
    assert {f.stat().st_uid for f in cache.iterdir()} == {attacker.uid}  # and the victim wrote nothing there


def test_install_turns_the_dsl_file_cache_off_for_the_process_and_its_children(tmp_path: Path) -> None:
    code = (
        "import os, subprocess, sys, fa4cache; fa4cache.install(sys.argv[1], compile_server=False)\n"
        "from cutlass.cutlass_dsl import CuTeDSL\n"
        "print(CuTeDSL._get_dsl().envar.disable_file_caching, os.environ['CUTE_DSL_DISABLE_FILE_CACHING'],\n"
        "      os.environ['FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED'])\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUTE_DSL_DISABLE_FILE_CACHING", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED")
    }
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.stdout.split()[-3:] == ["True", "1", "0"], out.stderr[-2000:]
    # A job that asks for the DSL's cache keeps it.
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s")],
        env={**env, "CUTE_DSL_DISABLE_FILE_CACHING": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.stdout.split()[-3:] == ["False", "0", "0"], out.stderr[-2000:]


# --------------------------------------------------------------------------- fifth review

_JIT_ONLY = """
import os, threading
import fa4cache
LOCK = threading.Lock()  # a value no key can describe: the kernel stays in memory only

@fa4cache.jit_cache
def build(n):
    with LOCK:
        return n

try:
    build(3)
    print("COMPILED")
except Exception as e:
    print("RAISED", type(e).__name__)
from cutlass.cutlass_dsl import CuTeDSL
print("DSL", CuTeDSL._get_dsl().envar.disable_file_caching, os.environ.get("CUTE_DSL_DISABLE_FILE_CACHING"))
"""


def test_jit_cache_without_install_closes_the_dsl_cache_and_expect_warm_stops_memory_only(
    tmp_path: Path,
) -> None:
    """Issue 50 (LOW): a process that uses ``@fa4cache.jit_cache`` without ``install()``
    turns the DSL's squattable /tmp file cache off too, and ``FA4CACHE_EXPECT_WARM=error``
    stops a jit_cache compile that can only be kept in memory, as it stops FA4's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUTE_DSL_DISABLE_FILE_CACHING", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED")
    }
    env.update(FA4CACHE_DIR=str(tmp_path / "s"), FA4CACHE_EXPECT_WARM="error")
    out = subprocess.run(
        [sys.executable, "-c", _JIT_ONLY], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    lines = out.stdout.split("\n")
    assert "RAISED UnexpectedCompile" in lines, (out.stdout, out.stderr[-2000:])
    assert "DSL True 1" in lines, (out.stdout, out.stderr[-2000:])
