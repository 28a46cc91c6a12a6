"""Which models ``"fa4cache"`` may be set on: those whose attention layers call transformers'
attention interface. transformers accepts any registered name for any model; a model with
its own attention code (Bloom, MPT, XGLM, GPT-NeoX-Japanese, GPT-Neo; Falcon before 5.25) never
calls fa4cache's attention, and reads the hook's 2-D padding mask as its own 4-D one: wrong
results (Bloom 0.016 off, MPT 0.3 off at batch 1), shape errors, or a bare ``KeyError``.
Which models those are is read from the installed transformers' code, never from a list of
names here: a release that moves a model to the interface (5.25's Falcon) needs no edit."""

from __future__ import annotations

from typing import Any

from .common import NAMES, patch_once
from .mask_functions import mark_block_family


def _uses_the_interface(cls: type) -> bool:
    # transformers' own test for setting an implementation after loading (its attention
    # classes call ALL_ATTENTION_FUNCTIONS.get_interface); models without such a class, the
    # multimodal wrappers, pass, and their parts are checked when they are built.
    check = getattr(cls, "_can_set_attn_implementation", None)
    return True if check is None else bool(check())


def refuse_models_outside_the_interface() -> None:
    """Make ``attn_implementation="fa4cache"`` on such a model a ``ValueError`` naming it and
    the implementations it has."""
    from transformers import PreTrainedModel

    def wrap(fn: Any) -> Any:
        def get_correct_attn_implementation(self: Any, requested_attention: Any, *args: Any, **kwargs: Any) -> Any:
            chosen = fn(self, requested_attention, *args, **kwargs)
            if chosen in NAMES:
                mark_block_family(self)  # (what the mask hook cannot tell while compiling)
            if chosen in NAMES and not _uses_the_interface(type(self)):
                raise ValueError(
                    f"fa4cache attention: {type(self).__name__} has attention code of its own and does not "
                    f"call transformers' attention interface, so attn_implementation={chosen!r} would never "
                    "run fa4cache (and its mask would be read wrong); load it with attn_implementation='eager'"
                    + (" or 'sdpa'" if getattr(self, "_supports_sdpa", False) else "")
                )
            return chosen

        return get_correct_attn_implementation

    patch_once(PreTrainedModel, "get_correct_attn_implementation", wrap)
