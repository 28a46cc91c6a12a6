"""A clean process that runs Python code as other users, for ``tests/store/test_other_users.py``.

Each request runs in a child forked from this server, which drops root after the fork.
Forking the pytest process itself is unsafe once earlier tests have left threads in it (a
child forked from it segfaulted once in CI, after the Ray tests had run an in-process
driver with its gRPC threads); this server is a fresh interpreter without threads. Everything the children need is
imported here first: after dropping root they may not be able to read the venv.

Protocol: ``python -m tests.helpers.as_user '<json list of modules to import>'``, then one JSON
request per line on stdin, one JSON reply per line on stdout: the child's exit status and
output, or, for a ``background`` request, its pid as soon as it is forked.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import tempfile
import textwrap
import time
import traceback
from typing import Any


def _child(req: dict[str, Any], out: int, err: int) -> None:
    """In the forked child: become the user, run the code, exit; never returns."""
    status = 1
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        logging.root.handlers.clear()
        os.setgroups([])
        os.setgid(req["gid"])
        os.setuid(req["uid"])
        os.umask(req["umask"])
        os.chdir(req["home"])
        os.environ.clear()
        os.environ.update(req["env"])
        try:
            exec(compile(textwrap.dedent(req["code"]), "<as-user>", "exec"), {"__name__": "__main__"})
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _start(req: dict[str, Any]) -> dict[str, Any]:
    """A background child (``"background": true``): reply with its pid at once; the test
    kills it, and the server reaps it."""
    with open(os.devnull, "wb") as null:
        pid = os.fork()
        if pid == 0:
            _child(req, null.fileno(), null.fileno())
    return {"pid": pid}


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _run(req: dict[str, Any]) -> dict[str, Any]:
    if req.get("background"):
        return _start(req)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            _child(req, out.fileno(), err.fileno())
        deadline = time.monotonic() + req["timeout"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return {"timeout": True}
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        return {
            "returncode": os.waitstatus_to_exitcode(status),
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def main() -> None:
    for name in json.loads(sys.argv[1]):
        importlib.import_module(name)
    if "fa4cache.fingerprint" in sys.modules:
        # What a publish records (package metadata): read now, while the venv and the
        # standard library are readable (the children drop root, and root's are not).
        sys.modules["fa4cache.fingerprint"].runtime_facts()
    if "fa4cache.identity" in sys.modules:  # where library and standard-library code lives
        sys.modules["fa4cache.identity"]._library_roots()
        sys.modules["fa4cache.identity"]._stdlib_roots()
    replies = sys.stdout
    for line in sys.stdin:
        replies.write(json.dumps(_run(json.loads(line))) + "\n")
        replies.flush()
        _reap()  # background children killed since the last request


if __name__ == "__main__":
    main()
