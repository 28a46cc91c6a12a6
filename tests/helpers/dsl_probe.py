"""A host-side ``@cute.jit`` function for the DSL cache squat test: the
victim's code. :mod:`tests.helpers.dsl_probe_evil` is the attacker's, whose IR the attacker files
under this function's name in a cache directory it made first."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def hello(a: cutlass.Int32) -> None:
    cute.printf("sum {}", a + 1)
