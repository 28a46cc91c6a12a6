"""fa4cache/errors.py: library warnings silenced inside fa4cache only."""

from __future__ import annotations


def test_the_library_warnings_are_silenced_inside_fa4cache_only() -> None:
    import warnings

    from fa4cache.errors import quiet_library_warnings

    msg = "Argument aux_data (position 21) cannot be converted to a JitArgument for function 'f'."
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_library_warnings():
            warnings.warn(msg, UserWarning, stacklevel=1)
        warnings.warn(msg, UserWarning, stacklevel=1)  # outside: the user's own code still warns
    assert [str(w.message) for w in seen] == [msg]
