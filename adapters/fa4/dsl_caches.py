"""The CuTe DSL's and FA4's own disk caches: closed wherever fa4cache installs (issue 34).

The DSL keeps compiled IR under ``$TMPDIR/$USER/cutlass_python_cache``, a directory it makes
without checking who owns it, and checks what it reads there only by CRC32: in a shared
``/tmp``, another user who made that directory first decides what a host-side ``@cute.jit``
call runs. FA4's own disk cache would store every kernel a second time. fa4cache's store
replaces both, so :func:`close` turns them off: in the environment, for the DSL to read when
it is imported and for every process started from this one (compile workers, ranks), and in
a DSL already imported (it reads its settings once, at its first use).

A job's own value wins, as in :meth:`~fa4cache.settings.Settings.job_env`: whoever sets
``CUTE_DSL_DISABLE_FILE_CACHING=0`` asks for the DSL's cache, and gets it.
"""

from __future__ import annotations

import logging
import os
import sys

from fa4cache.settings import DSL_CACHES_OFF

log = logging.getLogger(__name__)

DISABLE_VAR = "CUTE_DSL_DISABLE_FILE_CACHING"
_FALSE = ("0", "false", "no", "off")


def close() -> None:
    """Turn the DSL's and FA4's disk caches off in this process and its children."""
    for name, value in DSL_CACHES_OFF.items():
        os.environ.setdefault(name, value)
    if os.environ[DISABLE_VAR].strip().lower() in _FALSE:
        log.info(
            "fa4cache: %s=%s: the CuTe DSL's own file cache stays on", DISABLE_VAR, os.environ[DISABLE_VAR]
        )
        return
    _close_live_dsl()


def _close_live_dsl() -> None:
    """A DSL imported before fa4cache was installed has read its settings already: switch its
    file cache off where it keeps the switch. Its internals may move between versions; what
    cannot be found is left alone (the environment still covers every new process)."""
    dsl_mod = sys.modules.get("cutlass.base_dsl.dsl")
    meta = getattr(dsl_mod, "DSLSingletonMeta", None)
    for dsl in list(getattr(meta, "_instances", {}).values()):
        envar = getattr(dsl, "envar", None)
        if envar is not None and hasattr(envar, "disable_file_caching"):
            envar.disable_file_caching = True
    facts = sys.modules.get("cutlass.base_dsl.pyir_class_facts")
    cache_dir = getattr(facts, "_FACTS_CACHE_DIR", None)
    if isinstance(cache_dir, list) and cache_dir:
        cache_dir[0] = ""  # its per-class parse cache lives in the same directory
