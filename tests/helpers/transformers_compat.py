"""What differs between the transformers versions the tests run on (5.17 on the H200 image,
5.24 from a fresh install)."""

from __future__ import annotations

import functools


@functools.cache
def cache_kwarg() -> str:
    """``cache`` from transformers 5.2x (``past_key_values`` deprecated), else ``past_key_values``."""
    import inspect

    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def before_5_2x() -> bool:
    """transformers before 5.20 (5.17 on the H200 image): no continuous-batching resolution
    with a device argument, and a ``generate_batch`` that sizes its cache from a CUDA device."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return (major, minor) < (5, 20)
