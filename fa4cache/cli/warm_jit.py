"""``fa4cache warm``'s plan for kernels other than FA4's: QuACK's norm and cross-entropy
(``--hf-config ... --with-quack``) and manifest entries naming ``jit_cache`` functions."""

from __future__ import annotations

import argparse

from fa4cache.aot.jit_spec import JitCall, load_jit_manifest

from ..errors import ConfigError


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--with-quack",
        action="store_true",
        help="with --hf-config: also QuACK's RMSNorm and cross-entropy kernels at the model's hidden and "
        "vocabulary sizes",
    )
    s.add_argument(
        "--tokens",
        type=int,
        action="append",
        help="with --with-quack: tokens per step (RMSNorm's backward compiles per power-of-2 bucket; "
        "repeatable; default --seqlen)",
    )


def calls_from_args(args: argparse.Namespace) -> list[JitCall]:
    """The jit calls ``args`` ask for (none unless a manifest has jit entries or --with-quack)."""
    if getattr(args, "manifest", None):
        return load_jit_manifest(args.manifest)
    if not getattr(args, "with_quack", False):
        return []
    if not args.hf_config:
        raise ConfigError("--with-quack: needs --hf-config (the model's hidden and vocabulary sizes)")
    from fa4cache.adapters.compile import quack_calls
    from fa4cache.aot.model_config import _DTYPES, _positive_int, load_config

    cfg = load_config(args.hf_config)
    hidden = _positive_int(cfg, "hidden_size")
    vocab = _positive_int(cfg, "vocab_size") if "vocab_size" in cfg else None
    dtypes = args.dtype or [_DTYPES.get(cfg.get("dtype") or cfg.get("torch_dtype"), "bf16")]
    tokens = args.tokens or [args.seqlen]
    if any(t <= 0 for t in tokens):
        raise ConfigError(f"--tokens: expected positive ints, got {tokens}")
    return quack_calls(hidden, vocab, dtypes, tokens, backward=args.backward, arch=args.arch or "sm_90")
