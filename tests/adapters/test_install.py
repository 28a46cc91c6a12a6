"""``fa4cache.install()`` (adapters/install.py) on a store it cannot use: an error or one
warning, and kernels still run.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tests.store.test_other_users import _seed, people  # noqa: F401  (a fixture: two real users)

_INSTALL = """
import json, logging
messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
logging.getLogger().addHandler(Keep())
from fa4cache.adapters.install import install, uninstall
from fa4cache.errors import ConfigError
from tests.helpers.fake_compiler import FakeFA4
out = {}
for case, path in CASES.items():
    messages.clear()
    try:
        store = install(path, compile_server=False)
    except ConfigError as e:
        out[case] = {"raised": str(e), "warnings": list(messages)}
        continue
    at_install = list(messages)
    fa = FakeFA4(store)
    fa.call(1, 0)  # stored by _seed where there is a store
    fa.call(2, 0)  # stored nowhere
    out[case] = {"writable": store.writable, "compiles": fa.compiles, "at_install": at_install,
                 "warnings": list(messages)}
    uninstall()
print("RESULT", json.dumps(out))
"""


def test_an_unusable_store_at_install_is_an_error_or_one_warning_and_kernels_still_run(
    people: Any,  # noqa: F811
) -> None:
    """docs/store.md, "An unusable store directory": a path that can never be a directory is
    bad input (ConfigError naming the setting and the fix); a store that cannot be written
    (its parent cannot be created, it is read-only) is one warning at install naming the cause
    and the fix, the kernels already there still load, new ones run from memory."""
    from tests.store.test_other_users import PRELOAD, User

    victim, _, _ = people
    victim = User(victim.name, victim.home, (*PRELOAD, "fa4cache.adapters.install"))
    base = victim.home / "unusable"
    victim.run(f"import os; os.makedirs({str(base)!r}, exist_ok=True)")
    (base / "afile").write_text("")
    os.chown(base / "afile", victim.uid, victim.gid)
    locked = base / "locked"  # a parent the store cannot be created in
    read_only = base / "read-only"  # a store with kernel 1 in it, then made read-only
    _seed(victim, read_only)
    victim.run(
        f"import os\nos.makedirs({str(locked)!r}, mode=0o500)\n"
        f"for top, dirs, _ in os.walk({str(read_only)!r}):\n"
        f"    for d in dirs: os.chmod(os.path.join(top, d), 0o500)\n"
        f"os.chmod({str(read_only)!r}, 0o500)"
    )
    cases = {"file": str(base / "afile"), "parent": str(locked / "store"), "read-only": str(read_only)}
    r = json.loads(victim.run(f"CASES = {cases!r}\n" + _INSTALL).stdout.split("RESULT ", 1)[1])
    print(json.dumps(r, indent=1))
    # Bad input: raised, naming the argument and the fix; nothing warned.
    assert "cache_dir=" in r["file"]["raised"] and "is a file, not a directory" in r["file"]["raised"]
    assert "point cache_dir at a directory you own" in r["file"]["raised"] and not r["file"]["warnings"]
    for case, held in (("read-only", 1), ("parent", 0)):
        c = r[case]
        assert c["writable"] is False, (case, c)
        # One warning, at install, naming the directory, the cause and the fix; none per call.
        assert len(c["at_install"]) == 1 and c["warnings"] == c["at_install"], (case, c)
        (w,) = c["warnings"]
        assert f"cannot write to cache_dir={cases[case]}" in w and "not writable by you" in w, (case, w)
        assert "kernels will not be persisted" in w and "point cache_dir at" in w, (case, w)
        assert "FA4CACHE_BASE_DIRS" in w, (case, w)
        # The kernels already stored still load; the others run from memory.
        assert c["compiles"] == 2 - held, (case, c)
    assert "the kernels already there still load" in r["read-only"]["warnings"][0]
