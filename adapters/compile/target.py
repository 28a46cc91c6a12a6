"""The target a run compiles for, set in one place: :func:`target_scope`."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from fa4cache.aot.plan import Target


@contextmanager
def target_scope(target: Target) -> Iterator[None]:
    """Compile for ``target`` here: the one place that sets the cross-compile variables (FA4
    reads them at its first call, the DSL when it is built, QuACK when no GPU answers), for
    the run only; an already built DSL is pointed at the target. FA4's and the DSL's own deprecation warnings
    are not the user's concern here."""
    from fa4cache.adapters.compile.warm_jit_calls import pin_dsl_arch

    from fa4cache.arch import DSL_ARCH_VAR

    env = target.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        pin_dsl_arch(env[DSL_ARCH_VAR])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
