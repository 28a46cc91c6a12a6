"""The attacker's twin of :mod:`tests.helpers.dsl_probe`: the same function, another body."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def hello(a: cutlass.Int32) -> None:
    cute.printf("PWNED {}", a + 1)
