"""CuTe-DSL kernels other than FA4's, for the warm runner (:mod:`.runner`): QuACK's norm and cross-entropy kernels for a
model, and any jit-cached function a manifest names (:class:`fa4cache.aot.jit_spec.JitCall`).

QuACK kernels compile from their ``jit_cache`` keys alone (no tensors), so warming calls the
compile function with the key a training step would produce; ``fa4cache.install()`` routes
it into the store. :func:`quack_calls` spells those keys for a bf16/fp16 training step:
``quack.rmsnorm`` (forward saving rstd, backward on QuACK's plain fast path) at the hidden
size and ``quack.cross_entropy`` (forward with lse, backward) at the vocabulary size.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

from fa4cache.adapters.jit.jit_cache import JIT_ATTR

from fa4cache.aot.jit_spec import JitCall
from fa4cache.errors import ConfigError

log = logging.getLogger(__name__)

_CUTE_DTYPES = {"bf16": "cutlass.BFloat16", "fp16": "cutlass.Float16", "fp32": "cutlass.Float32"}


def _t(dtype: str) -> dict[str, str]:
    try:
        return {"type": _CUTE_DTYPES[dtype]}
    except KeyError:
        raise ConfigError(f"dtype: expected one of {', '.join(_CUTE_DTYPES)}, got {dtype!r}") from None


def bucket_tokens(tokens: int) -> int:
    """QuACK 0.6.5's ``rmsnorm._bucket_T_hint``: the row count rounded up to a power of 2.
    Spelled here so that listing the calls imports no CuTe DSL before the target arch is
    set (the DSL latches it when first built); a test checks it against QuACK's."""
    return 0 if tokens <= 0 else 1 << (tokens - 1).bit_length()


def pin_dsl_arch(cute_dsl_arch: str) -> None:
    """Make an already built CuTe DSL compile for ``cute_dsl_arch`` (QuACK's pool workers do
    the same: ``envar.arch`` is the DSL's override point); a DSL not built yet reads the
    environment when it is."""
    if "cutlass" not in sys.modules:
        return
    from cutlass.cutlass_dsl import CuTeDSL

    dsl = CuTeDSL._get_dsl()
    if str(dsl.envar.arch) != cute_dsl_arch:
        log.info(
            "fa4cache warm: the CuTe DSL was built for %s; compiling for %s", dsl.envar.arch, cute_dsl_arch
        )
        dsl.envar.arch = cute_dsl_arch


def quack_calls(
    hidden: int,
    vocab: int | None,
    dtypes: list[str],
    tokens: list[int],
    *,
    backward: bool = True,
    arch: str = "sm_90",
    weight_dtype: str | None = None,
) -> list[JitCall]:
    """The QuACK keys of a training step: ``quack.rmsnorm(x, weight)`` on ``(tokens, hidden)``
    and ``quack.cross_entropy(logits, int64 targets)`` on ``(tokens, vocab)``.

    RMSNorm's backward key holds the token count rounded up to a power of 2 (QuACK's
    ``_bucket_T_hint``): one kernel per bucket of ``tokens``.
    """
    rn, ce = "quack.rmsnorm:", "quack.cross_entropy:"
    out: list[JitCall] = []
    for d in dtypes:
        x, w = _t(d), _t(weight_dtype or d)
        # dtype, out, residual, weight, bias, residual_out, N, rstd, mean, layernorm, per_head, offset
        fwd = [x, x, None, w, None, None, hidden, backward, False, False, False, 0.0]
        out.append(
            JitCall(rn + "_compile_rmsnorm_fwd", tuple(fwd), arch=arch, name=f"rmsnorm fwd {d} N={hidden}")
        )
        if backward:
            for t_hint in sorted({bucket_tokens(t) for t in tokens}):
                # N, x, dout, dx, weight, db, dres, dres_out, dw, per_head
                bwd = [hidden, x, x, x, w, False, None, None, True, False]
                kw = (("T_hint", t_hint), ("is_layernorm", False), ("weight_offset", 0.0))
                out.append(
                    JitCall(
                        rn + "_compile_rmsnorm_bwd",
                        tuple(bwd),
                        kw,
                        arch,
                        f"rmsnorm bwd {d} N={hidden} T~{t_hint}",
                    )
                )
        if vocab is not None:
            i64 = {"type": "cutlass.Int64"}
            # dtype, target, target_logit, N, lse, dx, weight, target_logit_ndim
            ce_fwd = [x, i64, None, vocab, True, False, None, None]
            out.append(
                JitCall(
                    ce + "CrossEntropy.compile",
                    tuple(ce_fwd),
                    arch=arch,
                    name=f"cross_entropy fwd {d} V={vocab}",
                )
            )
            if backward:
                out.append(
                    JitCall(
                        ce + "CrossEntropyBackward.compile",
                        (x, i64, vocab, None),
                        arch=arch,
                        name=f"cross_entropy bwd {d} V={vocab}",
                    )
                )
    return out


def _import_path(path: str) -> Any:
    """``a.b.C.d``: import the longest module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(f"cannot import {path!r}")


def decode(value: Any) -> Any:
    """A manifest's JSON argument as the Python value (lists -> tuples, types imported)."""
    if isinstance(value, list):
        return tuple(decode(v) for v in value)
    if isinstance(value, dict):
        return _import_path(value["type"])
    return value


def resolve(function: str) -> Callable[..., Any]:
    """The jit-cached function named ``module:qualname``; other callables are refused (a
    manifest may only warm kernels, not run arbitrary code)."""
    module, _, qualname = function.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"jit: cannot import {module!r} ({e})") from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"jit: {module!r} has no {qualname!r}") from None
    if not hasattr(obj, JIT_ATTR):
        raise ConfigError(
            f"jit: {function} is not a @fa4cache.jit_cache function (nor a QuACK jit_cache function routed by "
            "fa4cache.install())"
        )
    return obj
