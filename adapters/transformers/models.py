"""Which models ``"fa4cache"`` may be set on: those whose attention layers call transformers'
attention interface. transformers accepts any registered name for any model; a model with
its own attention code (Bloom, MPT, XGLM, GPT-NeoX-Japanese, GPT-Neo; Falcon before 5.25) never
calls fa4cache's attention, and reads the hook's 2-D padding mask as its own 4-D one: wrong
results (Bloom 0.016 off, MPT 0.3 off at batch 1), shape errors, or a bare ``KeyError``.
A model that picks its attention layers from a table of its own by implementation name
(GIT, SAM: ``{"eager": ..., "sdpa": ...}``) has no layer for ``"fa4cache"`` (a bare
``KeyError`` while it is built). Which models those are is read from the installed
transformers' code, not from a list of names: a release that moves a model to the interface
(5.25's Falcon) needs no edit. The one list here, :data:`READS_THE_MASK_ITSELF`, names the few
models that call the interface and also read the mask in layer code of their own."""

from __future__ import annotations

from typing import Any

from .common import NAMES, patch_once
from .mask_functions import mark_block_family, mark_layer_causality

# Models whose own layer code reads the attention mask as transformers' 4-D one besides
# calling the interface (BigBird-Pegasus's encoder adds it to its scores, Doge's dynamic mask
# indexes it, T5Gemma 2 concatenates it): the hook's 2-D padding mask is a shape error there.
# Found by the model sweep (tests/helpers/model_sweep.py), which is what keeps this short list
# honest: a family that crashes or differs there is refused here or fixed.
READS_THE_MASK_ITSELF = ("BigBirdPegasus", "Doge", "T5Gemma2")


def _reads_the_mask_itself(cls: type) -> str | None:
    return next(
        (p for c in cls.__mro__ for p in READS_THE_MASK_ITSELF if c.__name__.startswith(p)
         and c.__module__.startswith("transformers.models.")),
        None,
    )  # fmt: skip


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
        def get_correct_attn_implementation(
            self: Any, requested_attention: Any, *args: Any, **kwargs: Any
        ) -> Any:
            chosen = fn(self, requested_attention, *args, **kwargs)
            if chosen in NAMES:
                mark_block_family(self)  # (what the mask hook cannot tell while compiling)
                why = _refusal(self, chosen)
                if why is not None:
                    raise ValueError(f"fa4cache attention: {why}")
            return chosen

        return get_correct_attn_implementation

    patch_once(PreTrainedModel, "get_correct_attn_implementation", wrap)


def _refusal(model: Any, chosen: str) -> str | None:
    """Why ``chosen`` (a fa4cache name) cannot run ``model``, with the fix; None when it can."""
    cls = type(model)
    fix = "load it with attn_implementation='eager'" + (
        " or 'sdpa'" if getattr(model, "_supports_sdpa", False) else ""
    )
    if not _uses_the_interface(cls):
        return (
            f"{cls.__name__} has attention code of its own and does not call transformers' attention "
            f"interface, so attn_implementation={chosen!r} would never run fa4cache (and its mask would be "
            f"read wrong); {fix}"
        )
    reader = _reads_the_mask_itself(cls)
    if reader is not None:
        return (
            f"{cls.__name__}'s own layer code reads the attention mask as transformers' 4-D mask ({reader} "
            f"models do), which attn_implementation={chosen!r} does not build; {fix}"
        )
    table = _own_attention_table(cls)
    if table is not None:
        name, choices = table
        return (
            f"{cls.__name__} picks its attention layers by implementation name from a table of its own "
            f"({name}: {', '.join(map(repr, choices))}), which has no {chosen!r}; load it with "
            "attn_implementation=" + " or ".join(repr(c) for c in choices if c in ("eager", "sdpa"))
        )
    return None


def _own_attention_table(cls: type) -> tuple[str, list[str]] | None:
    """A table of attention classes by implementation name (``"eager"`` among its keys, classes
    as its values) in the module of ``cls`` or of a class it derives from: the model builds
    its layers from it, and a name it lacks is a ``KeyError``. ``(its name, its keys)``."""
    import sys

    for c in cls.__mro__:
        module = sys.modules.get(c.__module__)
        if module is None or not c.__module__.startswith("transformers.models."):
            continue
        for name, value in vars(module).items():
            if (
                isinstance(value, dict)
                and "eager" in value
                and all(isinstance(k, str) and isinstance(v, type) for k, v in value.items())
                and not any(n in value for n in NAMES)
            ):
                return name, list(value)
    return None


def read_layer_causality() -> None:
    """After a model built with ``"fa4cache"`` has its layers (``post_init``, which every
    transformers model calls last in ``__init__``), note what they say of their causality,
    for the mask hook (:func:`.mask_functions.mark_layer_causality`)."""
    from transformers import PreTrainedModel

    def wrap(fn: Any) -> Any:
        def post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = fn(self, *args, **kwargs)
            if getattr(getattr(self, "config", None), "_attn_implementation", None) in NAMES:
                mark_layer_causality(self)
            return out

        return post_init

    patch_once(PreTrainedModel, "post_init", wrap)
