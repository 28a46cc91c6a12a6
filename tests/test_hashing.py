"""Canonical key encoding: stable, exact, and loud about what it cannot encode."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
from collections import namedtuple

import pytest

from fa4cache.errors import UnstableKeyError
from fa4cache.hashing import encode_key, key_digest
from fa4cache.identity import identity
from tests.conftest import ROOT


class Color(enum.Enum):
    RED = 1


NT = namedtuple("NT", "a b")


def test_distinguishes_types_that_compare_equal() -> None:
    assert encode_key((True,)) != encode_key((1,))
    assert encode_key((1,)) != encode_key((1.0,))
    assert encode_key((None,)) != encode_key((False,))
    assert encode_key(((1, 2),)) != encode_key((NT(1, 2),))
    assert encode_key((0.1,)) != encode_key((0.1 + 1e-17 * 10,)) or 0.1 == 0.1 + 1e-16


def test_encodes_fa4_key_element_types() -> None:
    torch = pytest.importorskip("torch")
    import cutlass

    key = (
        False,
        None,
        cutlass.BFloat16,
        128,
        "ab" * 32,
        ((torch.int32, None, (None, 1)),),
        8.0,
        Color.RED,
        NT(1, 2),
    )
    text = encode_key(key)
    assert "cutlass" in text and "torch.int32" in text and "RED" in text
    assert json.loads(text)  # valid JSON


@pytest.mark.parametrize("bad", [object(), lambda: 1, {1, 2}, b"bytes", {"a": 1}])
def test_unstable_elements_are_refused(bad: object) -> None:
    with pytest.raises(UnstableKeyError, match="no stable encoding"):
        encode_key((1, bad))


def test_local_classes_are_refused() -> None:
    class Local:
        pass

    with pytest.raises(UnstableKeyError, match="locally defined"):
        encode_key((Local,))


def test_digest_is_the_same_in_other_processes_and_seeds() -> None:
    code = (
        "from fa4cache.hashing import encode_key, key_digest\n"
        "import enum\n"
        "print(key_digest('tc', 'fwd', encode_key((True, 3, 2.5, 'x', None, (1, (2,)), frozenset({1, 2, 3})))))"
    )
    outs = set()
    for seed in ("0", "1", "4242"):
        p = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        )
        assert p.returncode == 0, p.stderr
        outs.add(p.stdout.strip())
    here = key_digest("tc", "fwd", encode_key((True, 3, 2.5, "x", None, (1, (2,)), frozenset({1, 2, 3}))))
    assert outs == {here}


def test_identity_follows_helpers() -> None:
    def helper_a(x: int) -> int:
        return x + 1

    def helper_b(x: int) -> int:
        return x + 2

    def make(h):  # type: ignore[no-untyped-def]
        def f(x):  # type: ignore[no-untyped-def]
            return h(x)

        return f

    # Same outer source, different helper in the closure: different digest.
    assert identity(make(helper_a)).digest != identity(make(helper_b)).digest
    # Same helper twice (fresh closures, new ids): same digest.
    assert identity(make(helper_a)).digest == identity(make(helper_a)).digest
    assert identity(make(helper_a), "spec=1").digest != identity(make(helper_a), "spec=2").digest
