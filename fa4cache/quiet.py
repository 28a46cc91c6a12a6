"""Library warnings a user cannot act on, silenced inside fa4cache's own calls only.

A warning is for something the user should change. These come from FA4's and PyTorch's
internals when fa4cache drives them and name nothing the user wrote:

* CUTLASS's ``Argument aux_data (position N) cannot be converted to a JitArgument``
  (~600 characters): FA4 passes its mask's aux tensors as a compile-time list, which the
  DSL's compile-only path notes on every compile of a mask with aux tensors;
* PyTorch's ``Accessing the data pointer of FakeTensor ... almost definitely a bug in your
  code``: ``warm`` traces FA4 on fake tensors, and the DSL reads their data pointer (nothing
  runs: harmless).

:func:`quiet_library_warnings` ignores exactly these messages for the duration of a call;
the same warnings from the user's own code, outside it, still show.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# (category, message regex matched at the start of the warning's text)
NOT_ACTIONABLE: tuple[tuple[type[Warning], str], ...] = (
    (UserWarning, r"Argument aux_data \(position \d+\) cannot be converted to a JitArgument"),
    (Warning, r"Accessing the data pointer of FakeTensor"),
)


@contextmanager
def quiet_library_warnings() -> Iterator[None]:
    """Ignore :data:`NOT_ACTIONABLE` inside the block (the filters before it are restored)."""
    with warnings.catch_warnings():
        for category, message in NOT_ACTIONABLE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
