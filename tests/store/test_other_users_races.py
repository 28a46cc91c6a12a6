"""The third security review's findings, one test each, with a victim and an attacker.

The races (findings 1-3) run for a bounded time each and count both sides: how often the
attacker's bytes or directory were used (must be 0) and how often the victim really
loaded or opened (must be > 0), so that a test that never raced cannot pass. Users and
the run-as-user server come from ``tests/store/test_other_users.py``; root-only, like those tests.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fa4cache.errors import ConfigError
from tests.store.test_other_users import PRELOAD, User, _mount_tmpfs, _probe, _seed, _server_request

from . import test_other_users as _sec

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root to create the victim and attacker users (CI runs as root)",
)

people = _sec.people  # the victim and the attacker (a module-scoped fixture)
RACE_SECONDS = 15.0
CUTE_PRELOAD = (*PRELOAD, "fa4cache.adapters.fa4.artifacts", "tests.helpers.cute_preload")
HOOK_PRELOAD = (*PRELOAD, "fa4cache.ray_integration.hook", "fa4cache.adapters.install")


def _as(user: User, preload: tuple[str, ...]) -> User:
    return User(user.name, user.home, preload)


def _result(p: Any) -> dict[str, Any]:
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.split("RESULT ", 1)[1].splitlines()[0])


def _sticky(base: Path, name: str) -> Path:
    """A root-owned world-writable sticky directory, like /tmp or /var/tmp."""
    d = base / name
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o1777)
    return d


# --------------------------------------------------------------------------- 1 (high)


@pytest.fixture
def fa4_kernel(causal_fwd_store: dict[str, Any]) -> Path:
    """A store with one real FA4 forward kernel, cross-compiled for sm_90 on the CPU (the
    suite's shared one: copy it to change it)."""
    assert causal_fwd_store["result"]["compiles"] == 1, causal_fwd_store["result"]
    return causal_fwd_store["dir"]


@pytest.mark.compile
def test_the_loader_copy_cannot_be_swapped_in_a_shared_tmpdir(people: Any, fa4_kernel: Path) -> None:
    victim, attacker, base = people
    victim, attacker = _as(victim, CUTE_PRELOAD), _as(attacker, CUTE_PRELOAD)
    store = victim.home / "fa4-store"
    shutil.copytree(fa4_kernel, store)
    for p in [store, *store.rglob("*")]:
        os.chown(p, victim.uid, victim.gid, follow_symlinks=False)
    (obj,) = store.glob("v2/*/*/*.o")
    tmp = base / "shared-tmp"  # a project's shared tmp: anyone may write, not sticky
    tmp.mkdir()
    os.chmod(tmp, 0o777)
    pid_file, ready = tmp / "victim.pid", tmp / "attacker.ready"
    # The attacker swaps every new directory of the victim's in $TMPDIR for one of its own,
    # and keeps renaming its object file over the name the victim's loader will open.
    attacker_pid = attacker.start(
        f"""
        import os, time
        T, digest = {str(tmp)!r}, {obj.stem!r}
        payload = b"ATTACKER" * 4096
        open({str(ready)!r}, "w").close()
        end = time.monotonic() + {RACE_SECONDS + 30}
        pid, seen, n = None, set(), 0
        while time.monotonic() < end:
            if pid is None:
                try:
                    pid = open({str(pid_file)!r}).read().strip() or None
                except OSError:
                    pass
                continue
            for d in os.listdir(T):
                if d in seen or d.endswith((".pid", ".ready")) or d.startswith(".moved"):
                    continue
                seen.add(d)
                n += 1
                try:
                    os.rename(f"{{T}}/{{d}}", f"{{T}}/.moved-{{n}}")
                    os.mkdir(f"{{T}}/{{d}}", 0o777)
                    os.chmod(f"{{T}}/{{d}}", 0o777)
                except OSError:
                    continue
                try:
                    with open(f"{{T}}/{{d}}/.a", "wb") as f:
                        f.write(payload)
                except OSError:
                    continue
                stop = time.monotonic() + 0.05
                while time.monotonic() < stop:
                    for name in (f"{{digest}}.{{pid}}.o", f"{{digest}}.o"):
                        try:
                            os.link(f"{{T}}/{{d}}/.a", f"{{T}}/{{d}}/.b")
                            os.rename(f"{{T}}/{{d}}/.b", f"{{T}}/{{d}}/{{name}}")
                        except OSError:
                            pass
        """
    )
    try:
        p = victim.run(
            f"""
            import json, os, tempfile, time
            tempfile.tempdir = None  # this process's $TMPDIR, not the one the server saw
            from fa4cache.settings import Settings
            from fa4cache.store import Store
            from fa4cache.adapters.fa4.artifacts import load_callable
            store = Store(Settings.from_env({str(store)!r}))
            (e,) = list(store.layout.iter_entries())
            art = store.load(e.ref)
            assert art is not None
            deadline = time.monotonic() + 30
            while not os.path.exists({str(ready)!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            loads = wins = other = 0
            errors = []
            end = time.monotonic() + {RACE_SECONDS}
            while time.monotonic() < end:
                try:
                    load_callable(art)
                    loads += 1
                except Exception as ex:  # the verified bytes always load: anything else is theirs
                    if "not recognized as a valid object file" in str(ex):
                        wins += 1
                    else:
                        other += 1
                        errors.append(f"{{type(ex).__name__}}: {{ex}}"[:200])
            print("RESULT", json.dumps({{"loads": loads, "wins": wins, "other": other, "errors": errors[:3]}}))
            """,
            env={"TMPDIR": str(tmp)},
            timeout=RACE_SECONDS + 120,
        )
    finally:
        os.kill(attacker_pid, 9)
    r = _result(p)
    print(f"loader copy race, {RACE_SECONDS:.0f} s: {r}")
    assert r["wins"] == 0, r
    assert r["loads"] > 0 and r["other"] == 0, r


# --------------------------------------------------------------------------- 2 (medium)


def test_missing_parents_are_created_and_checked_one_at_a_time(people: Any) -> None:
    victim, attacker, base = people
    sticky = _sticky(base, "node-tmp")
    parent = sticky / victim.name  # FA4CACHE_DIR=/tmp/{user}/fa4cache on a fresh node
    attacker_pid = attacker.start(
        f"""
        import os, time
        p = {str(parent)!r}
        end = time.monotonic() + {RACE_SECONDS + 30}
        while time.monotonic() < end:
            try:
                os.mkdir(p)
                os.chmod(p, 0o777)
                time.sleep(0.0001)  # long enough for a victim's mkdir inside it
            except OSError:
                pass
            try:
                os.rmdir(p)
            except OSError:
                pass
        """
    )
    try:
        p = victim.run(
            f"""
            import json, logging, os, shutil, time
            logging.disable(logging.CRITICAL)
            from fa4cache.errors import InsecurePath
            from fa4cache.settings import Settings
            from fa4cache.store.root import open_root
            parent = {str(parent)!r}
            root = os.path.join(parent, "fa4cache")
            settings = Settings.from_env(root)
            opens = refused = memory_only = wins = 0
            end = time.monotonic() + {RACE_SECONDS}
            while time.monotonic() < end:
                try:
                    _, writable = open_root(settings, lambda tag, msg: None)  # what Store() opens with
                except InsecurePath:
                    refused += 1
                    continue
                if not writable:
                    memory_only += 1
                    continue
                opens += 1
                if os.lstat(parent).st_uid != os.getuid():
                    wins += 1  # our new store sits in the attacker's directory
                    shutil.rmtree(root, ignore_errors=True)
                else:
                    shutil.rmtree(parent, ignore_errors=True)
            print("RESULT", json.dumps(dict(opens=opens, refused=refused, memory_only=memory_only, wins=wins)))
            """,
            timeout=RACE_SECONDS + 60,
        )
    finally:
        os.kill(attacker_pid, 9)
    r = _result(p)
    print(f"parent creation race, {RACE_SECONDS:.0f} s: {r}")
    assert r["wins"] == 0, r
    assert r["opens"] > 0 and r["refused"] > 0, r  # both sides of the race happened


# --------------------------------------------------------------------------- 3 (medium)


def test_lookups_read_the_directories_they_checked(people: Any) -> None:
    """The store's parent becomes writable by others after the job started (what finding 2
    produced, or a project directory opened to the group); the attacker then keeps swapping
    the store for a link to another store of the victim's, with other bytes for the same
    key (an older, vulnerable kernel, say). Every path lookup would follow it."""
    victim, attacker, base = people
    proj = victim.home / "proj3"
    decoy = victim.home / "decoy3"
    go = proj / "go"
    attacker_pid = attacker.start(
        f"""
        import os, time
        P, R, D = {str(proj)!r}, {str(proj / "store")!r}, {str(decoy)!r}
        deadline = time.monotonic() + 60
        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
            time.sleep(0.01)
        end = time.monotonic() + {RACE_SECONDS + 5}
        swaps = 0
        while time.monotonic() < end:
            try:
                os.rename(R, P + "/.real")
                os.symlink(D, R)
                swaps += 1
                time.sleep(0.0005)
                os.unlink(R)
                os.rename(P + "/.real", R)
            except OSError:
                pass
            if swaps % 100 == 1:  # whole numbers only: the test reads it while this runs
                with open(P + "/.swaps", "w") as f:
                    f.write(str(swaps))
                os.replace(P + "/.swaps", P + "/swaps")
        """
    )
    os.chmod(victim.home, 0o755)  # the attacker must reach proj/ (the victim's home is 0700)
    try:
        p = victim.run(
            f"""
            import json, os, time
            from fa4cache.settings import Settings
            from fa4cache.store import Store
            from tests.helpers.fake_compiler import FakeFA4
            os.makedirs({str(proj)!r}, mode=0o755)
            store = Store(Settings.from_env({str(proj / "store")!r}))
            FakeFA4(store).call(1, 0)
            (e,) = list(store.layout.iter_entries())
            real = store.load(e.ref).data
            other = b"DECOY" * 400
            decoy = Store(Settings.from_env({str(decoy)!r}))
            assert decoy.publish_bytes(e.ref, other, **store.load(e.ref).sidecar.facts())
            assert decoy.load(e.ref).data == other
            os.chmod({str(proj)!r}, 0o777)  # after the start-up checks
            open({str(go)!r}, "w").close()
            loads = wins = misses = 0
            end = time.monotonic() + {RACE_SECONDS}
            while time.monotonic() < end:
                art = store.load(e.ref)
                if art is None:
                    misses += 1
                elif art.data == real:
                    loads += 1
                elif art.data == other:
                    wins += 1
            print("RESULT", json.dumps(dict(loads=loads, wins=wins, misses=misses)))
            """,
            timeout=RACE_SECONDS + 60,
        )
    finally:
        os.kill(attacker_pid, 9)
        os.chmod(victim.home, 0o700)
    r = _result(p)
    print(f"directory swap race, {RACE_SECONDS:.0f} s: {r}")
    assert r["wins"] == 0, r
    assert r["loads"] > 0, r
    assert int((proj / "swaps").read_text()) > 100  # the attacker really swapped, all along


# --------------------------------------------------------------------------- 4, 8 (CLI)


def _squat(victim: User, attacker: User, mode: int = 0o777) -> Path:
    squat = Path(f"/var/tmp/fa4cache-{victim.name}")
    shutil.rmtree(squat, ignore_errors=True)
    squat.mkdir(mode=mode)
    os.chmod(squat, mode)
    os.chown(squat, attacker.uid, attacker.gid)
    return squat


NODE_LOCAL = Path("/var/tmp/fa4cache-{user}")


def test_every_command_uses_the_store_the_workers_use(people: Any) -> None:
    victim, attacker, _ = people
    squat = _squat(victim, attacker)
    fallback = victim.home / ".cache" / "fa4cache"
    try:
        _seed(victim, NODE_LOCAL)  # the workers fall back to the private default
        assert len(list(fallback.glob("v2/*/*/*.o"))) == 1
        for args in (("stats", "--zero"), ("ls", "--json"), ("verify",), ("prune", "--max-size", "1G")):
            p = victim.cli(NODE_LOCAL, *args)
            assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stdout, p.stderr)
            assert list(squat.iterdir()) == [], (args, list(squat.iterdir()))  # nothing written there
        assert (fallback / "stats" / "zero.json").is_file()
        p = victim.cli(NODE_LOCAL, "stats", "--json")
        assert p.returncode == 0 and json.loads(p.stdout)["cache_dir"] == str(fallback)
        assert json.loads(p.stdout)["entries"] == 1
    finally:
        shutil.rmtree(squat, ignore_errors=True)
        shutil.rmtree(fallback, ignore_errors=True)


def test_clear_on_a_squatted_default_names_the_store_first(people: Any) -> None:
    victim, attacker, _ = people
    squat = _squat(victim, attacker)
    fallback = victim.home / ".cache" / "fa4cache"
    try:
        _seed(victim, NODE_LOCAL)
        # Without --yes and without a terminal: refused, naming both directories.
        p = victim.cli(NODE_LOCAL, "clear")
        assert p.returncode == 2 and str(fallback) in p.stderr and str(squat) in p.stderr, p.stderr
        assert len(list(fallback.glob("v2/*/*/*.o"))) == 1
        p = victim.cli(NODE_LOCAL, "clear", "--yes")
        assert p.returncode == 0, p.stderr
        first = p.stdout.splitlines()[0]
        assert first.startswith("removing") and str(fallback) in first and str(squat) in first, p.stdout
        assert list(fallback.glob("v2/*/*/*.o")) == [] and list(squat.iterdir()) == []
    finally:
        shutil.rmtree(squat, ignore_errors=True)
        shutil.rmtree(fallback, ignore_errors=True)


# --------------------------------------------------------------------------- 5, 6 (Ray hook)

_HOOK = """
import json, logging, os
messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.WARNING)
from fa4cache.ray_integration import hook
hook.setup()
from fa4cache.store import runtime
s = runtime.installed_store()
print("RESULT", json.dumps({"root": str(s.root), "writable": s.writable,
      "env_dir": os.environ.get("FA4CACHE_DIR"), "warnings": [m for m in messages if "fa4cache" in m],
      "dsl_cache": os.environ.get("CUTE_DSL_DISABLE_FILE_CACHING")}))
"""


def test_every_node_local_path_falls_back_with_one_warning(people: Any) -> None:
    victim, attacker, base = people
    victim = _as(victim, HOOK_PRELOAD)
    nodes = _sticky(base, "nodes")
    host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname())
    fallback = victim.home / ".cache" / "fa4cache"
    cases = [
        ({"FA4CACHE_DIR": str(nodes / "{user}-{hostname}")}, nodes / f"{victim.name}-{host}"),
        ({"FA4CACHE_DIR": str(nodes / "nvme"), "FA4CACHE_NODE_LOCAL": "1"}, nodes / "nvme"),
        (
            {"FA4CACHE_NODE_LOCAL": "1", "FA4CACHE_DIR": str(NODE_LOCAL)},
            Path(f"/var/tmp/fa4cache-{victim.name}"),
        ),
    ]
    for env, squatted in cases:
        shutil.rmtree(squatted, ignore_errors=True)
        squatted.mkdir(mode=0o755)
        os.chown(squatted, attacker.uid, attacker.gid)
        try:
            r = _result(victim.run(_HOOK, env=env))
        finally:
            shutil.rmtree(squatted, ignore_errors=True)
        assert r["root"] == str(fallback) and r["writable"] and r["env_dir"] == str(fallback), (env, r)
        assert len(r["warnings"]) == 1 and f"using {fallback} instead" in r["warnings"][0], (env, r)
        assert r["dsl_cache"] == "1"  # finding 9: the CuTe DSL's own file cache is off in workers


def test_a_full_disk_does_not_kill_the_worker_hook(people: Any) -> None:
    victim, _, base = people
    victim = _as(victim, HOOK_PRELOAD)
    mnt = base / "full"
    if not _mount_tmpfs(mnt, "size=1m,nr_inodes=8,mode=1777"):
        pytest.skip("cannot mount a tmpfs here: a full disk cannot be made")
    try:
        n = 0
        with pytest.raises(OSError):  # fill every inode: a fresh node whose disk is full
            while n < 100:
                (mnt / f"f{n}").write_bytes(b"")
                n += 1
        r = _result(victim.run(_HOOK, env={"FA4CACHE_DIR": str(mnt / "fa4cache-{user}")}))
        assert not r["writable"] and len(r["warnings"]) == 1 and "not be persisted" in r["warnings"][0], r
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# --------------------------------------------------------------------------- 7 (base stores)


def test_a_squatted_base_store_is_ignored_by_default_and_refused_on_request(people: Any) -> None:
    victim, attacker, base = people
    team = _sticky(base, "scratch") / "team-base"
    made = attacker.run(f"import os; os.mkdir({str(team)!r}, 0o755)")  # created first by the attacker
    assert made.returncode == 0, made.stderr
    r = _probe(victim, victim.home / "local7", env={"FA4CACHE_BASE_DIRS": str(team)})
    assert r["compiles"] == 1 and r["disk_hits"] == 0
    code = f"""
        from fa4cache.settings import Settings
        from fa4cache.store import Store
        s = Store(Settings.from_env({str(victim.home / "local7b")!r}))
        print("RESULT", len(s.bases))
        """
    p = victim.run(code, env={"FA4CACHE_BASE_DIRS": str(team)})
    assert p.returncode == 0 and "RESULT 0" in p.stdout and "ignoring it" in p.stderr, p.stderr
    p = victim.run(code, env={"FA4CACHE_BASE_DIRS": str(team), "FA4CACHE_INSECURE": "refuse"})
    assert p.returncode != 0 and "InsecurePath" in p.stderr and "owned by uid" in p.stderr, p.stderr


# --------------------------------------------------------------------------- 8 (low)


def test_node_id_with_a_placeholder_is_not_a_traceback(people: Any) -> None:
    victim, _, base = people
    (base / "n1").mkdir()
    os.chown(base / "n1", victim.uid, victim.gid)
    _seed(victim, base / "n1" / "store")  # a store there: a named path with none is an error (exit 2)
    p = victim.cli(base / "{node_id}" / "store", "stats", "--json", env={"FA4CACHE_NODE_ID": "n1"})
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert json.loads(p.stdout)["cache_dir"] == str(base / "n1" / "store")


def test_a_user_without_a_passwd_entry_gets_a_path_of_its_own(people: Any) -> None:
    _, _, base = people
    uid = next(u for u in range(4242, 4342) if not _has_passwd(u))
    home = base / "ghost"
    home.mkdir()
    os.chown(home, uid, uid)
    ghost = User.__new__(User)
    ghost.name, ghost.uid, ghost.gid, ghost.home, ghost.preload = "ghost", uid, uid, home, PRELOAD
    argv = ["--cache-dir", str(base / "{user}-cache"), "stats", "--json"]
    req = ghost._request(
        f"import sys; from fa4cache.cli import main; sys.exit(main({argv!r}))", None, 60, 0o022
    )
    req["env"] = {"HOME": str(home)}  # no USER, no LOGNAME, no passwd entry
    reply = _server_request(req)
    # No store is there yet, which a named path must hold (exit 2); the message names the path
    # the placeholder gave.
    assert reply["returncode"] == 2 and "Traceback" not in reply["stderr"], reply["stderr"]
    assert f"--cache-dir {base / f'uid{uid}-cache'} is not a store" in reply["stderr"], reply["stderr"]


def _has_passwd(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_a_twenty_digit_pid_in_file_names_is_not_a_traceback(people: Any) -> None:
    victim, _, _ = people
    mine = victim.home / "store8pid"
    _seed(victim, mine)
    host = socket.gethostname()
    counters = mine / "stats" / f"{host}~{'9' * 20}~ab.json"
    counters.write_text(json.dumps({"host": host, "updated": 0, "counters": {"compiles": 1}}))
    (obj,) = mine.glob("v2/*/*/*.o")
    tmp = obj.parent / f".tmp.{obj.name}~{host}~{'9' * 20}~abcd"
    tmp.write_bytes(b"x")
    for f in (counters, tmp):
        os.chown(f, victim.uid, victim.gid)
    for args in (("stats",), ("prune", "--max-size", "1G")):
        p = victim.cli(mine, *args)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stderr)
    assert not tmp.exists() and not counters.exists()  # a pid that cannot exist: a dead writer's


def test_a_base_path_with_the_separator_is_refused_not_split() -> None:
    import fa4cache

    with pytest.raises(ConfigError, match="base_dirs.*':'"):
        fa4cache.env("/tmp/x", base_dirs=["/data/team:a"])
    env = fa4cache.env("/tmp/x", base_dirs=["/data/a", "/data/b"])["env_vars"]
    assert env["FA4CACHE_BASE_DIRS"] == "/data/a:/data/b"


# --------------------------------------------------------------------------- 9 (info)


def test_the_job_environment_turns_the_cute_dsl_file_cache_off(tmp_path: Path) -> None:
    from fa4cache.settings import Settings

    env = Settings.from_env(tmp_path).job_env()
    assert env["CUTE_DSL_DISABLE_FILE_CACHING"] == "1"
    # The DSL itself reads the variable under that name.
    code = "from cutlass.cutlass_dsl import CuTeDSL; print(CuTeDSL._get_dsl().envar.disable_file_caching)"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-2000:]


# --------------------------------------------------------------------------- fourth review


def test_racing_the_squat_fallback_never_makes_a_start_memory_only(people: Any) -> None:
    """Finding 7: the attacker creates and removes each fresh node-local path as the victim's
    store is made there. A mkdir that fails with EEXIST and an open that then fails with
    ENOENT was taken as 'unwritable' (11 of 40 starts memory-only); it is a race to retry."""
    victim, attacker, base = people
    nodes = _sticky(base, "race-nodes")
    current = nodes / "current"
    attacker_pid = attacker.start(
        f"""
        import os
        name = ""
        n = 0
        while True:
            if n % 64 == 0:
                try:
                    name = open({str(current)!r}).read()
                except OSError:
                    pass
            n += 1
            if name:
                p = os.path.join({str(nodes)!r}, name)
                try:
                    os.mkdir(p, 0o755)
                except OSError:
                    pass
                try:
                    os.rmdir(p)
                except OSError:
                    pass
        """
    )
    try:
        p = victim.run(
            f"""
            import json, os, time
            from fa4cache.settings import Settings
            from fa4cache.store import Store
            starts = []
            for i in range(300):
                tmp = {str(current)!r} + ".tmp"
                with open(tmp, "w") as f:
                    f.write(f"n{{i}}")
                os.chmod(tmp, 0o644)
                os.replace(tmp, {str(current)!r})
                time.sleep(0.005)  # the attacker is racing this name now
                s = Store(Settings.from_env(os.path.join({str(nodes)!r}, f"n{{i}}")))
                starts.append([s.writable, str(s.root)])
            print("RESULT", json.dumps(starts))
            """,
            env={"FA4CACHE_NODE_LOCAL": "1"},
            timeout=120,
        )
    finally:
        os.kill(attacker_pid, 9)
    starts = _result(p)
    fallback = str(victim.home / ".cache" / "fa4cache")
    at_path = sum(w and r != fallback for w, r in starts)
    print(f"{len(starts)} starts: {at_path} at the path, {sum(r == fallback for _, r in starts)} at the fallback, "
          f"{sum(not w for w, _ in starts)} memory-only")  # fmt: skip
    assert all(w for w, _ in starts), starts  # never memory-only
