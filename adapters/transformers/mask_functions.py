"""Which of transformers' mask functions the FA4 path computes itself.

The mask hook gets the 2-D padding mask and a ``mask_function``, the rule transformers
composed for the layer kind (``and_masks``/``or_masks`` of closures from
``transformers.masking_utils``). The FA4 path rebuilds causal, sliding-window, padding and
packed-document masks from the layer's arguments; anything else in that rule (Llama 4's
attention chunks, Gemma 3's image tokens that see each other, a model's own
``or_mask_function``/``and_mask_function``) it would drop without a word. Such a rule is
found here, so the hook can hand the layer transformers' own dense mask instead (the step
then runs through PyTorch, as eager computes it).
"""

from __future__ import annotations

from typing import Any

_MODULE = "transformers.masking_utils"
# Rules the FA4 path computes from the layer's own arguments (causal, sliding_window) and the
# 2-D mask or position_ids the hook passes on.
_COMPUTED = frozenset(
    {
        "causal_mask_function",
        "bidirectional_mask_function",
        "sliding_window_overlay.<locals>.inner_mask",
        "padding_mask_function.<locals>.inner_mask",
        "packed_sequence_mask_function.<locals>.inner_mask",
    }
)
# Wrappers whose meaning is the intersection of what they wrap (offsets and position remaps
# move indices; the FA4 path aligns queries to keys itself).
_INTERSECTIONS = frozenset(
    {
        "and_masks.<locals>.and_mask",
        "add_offsets_to_mask_function.<locals>.inner_mask",
        "remap_positions_for_packed_sequence.<locals>.inner_mask",
    }
)
_NAMED = {
    "chunked_overlay.<locals>.inner_mask": "chunked attention (attention_chunk_size)",
    "blockwise_overlay.<locals>.inner_mask": "blocks of tokens that see each other (block_sequence_ids, e.g. image tokens)",
    "or_masks.<locals>.or_mask": "a mask widened by or_mask_function (e.g. image tokens that see each other)",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask": "a bidirectional sliding window",
}
_DEPTH = 16  # transformers nests a few levels; a deeper rule is not one of its own


def _parts(fn: Any) -> list[Any]:
    """The mask functions a wrapper closes over (``and_masks`` keeps a tuple of them)."""
    out: list[Any] = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(v, tuple):
            out.extend(x for x in v if callable(x))
        elif callable(v) and not isinstance(v, type):
            out.append(v)
    return out


def not_computed(mask_function: Any, depth: int = 0) -> str | None:
    """What part of ``mask_function`` the FA4 path would not compute (None: all of it)."""
    if mask_function is None:
        return None
    module = getattr(mask_function, "__module__", None)
    name = getattr(mask_function, "__qualname__", None) or repr(mask_function)
    if module != _MODULE:
        return f"a custom mask function ({module}.{name})"
    if name in _COMPUTED:
        return None
    if name in _INTERSECTIONS and depth < _DEPTH:
        for part in _parts(mask_function):
            why = not_computed(part, depth + 1)
            if why is not None:
                return why
        return None
    return _NAMED.get(name, f"transformers' mask function {name}")


def not_computed_while_tracing(mask_function: Any, q_length: int, kwargs: dict[str, Any]) -> str | None:
    """:func:`not_computed` from what torch.compile lets a traced hook read: the rule's own
    name, not the closures under it (dynamo cannot convert their cells), and the flags
    transformers sets beside it. An ``or`` at the top is a widened rule (image blocks, a
    model's ``or_mask_function``); ``use_vmap`` marks a model's own mask function anywhere; a
    chunked layer's ``local_size`` is the config's ``attention_chunk_size``; only the
    bidirectional mask makers pass ``allow_is_bidirectional_skip``. One case stays hidden
    under an ``and`` of packed documents: image blocks of a family that passes
    ``block_sequence_ids``, which :data:`BLOCK_FAMILIES` names (a decode step's new tokens are
    text: its blocks add nothing)."""
    why = vmap_reason(kwargs)
    if why is not None:
        return why
    chunk = getattr(kwargs.get("config"), "attention_chunk_size", None)
    if chunk is not None and kwargs.get("local_size") == chunk:
        return "chunked attention (attention_chunk_size)"
    if "allow_is_bidirectional_skip" in kwargs and kwargs.get("local_size") is not None:
        return _NAMED["sliding_window_bidirectional_overlay.<locals>.inner_mask"]
    # Read outright (for a closure made in the graph dynamo answers hasattr False and
    # getattr's default) and compared, not hashed (nor can it hash the name it reads).
    try:
        name = mask_function.__qualname__
    except AttributeError:
        name = None
    for known, why in _NAMED.items():
        if name == known:
            return why
    if (
        any(name == known for known in _INTERSECTIONS)
        and q_length > 1
        and not kwargs.get("allow_is_causal_skip", True)
        and block_family(kwargs.get("config"))
    ):
        return "packed documents of a model with image blocks (block_sequence_ids), while compiling"
    return None


def vmap_reason(kwargs: dict[str, Any]) -> str | None:
    """transformers turns ``use_vmap`` on exactly when the model passed its own
    ``or_mask_function``/``and_mask_function`` (ESMC's ``sequence_id`` documents come that
    way, as ``packed_sequence_mask_function``, which the FA4 path would not see)."""
    if kwargs.get("use_vmap"):
        return "a mask widened or narrowed by the model's own mask function"
    return None


# The model families whose mask makers take ``block_sequence_ids`` (transformers 5.24;
# tests/adapters/transformers/test_mask_functions.py fails when a new one appears).
BLOCK_FAMILIES = (
    "deepseek_ocr2", "diffusion_gemma", "gemma3", "gemma4", "gemma4_unified", "git", "hrm_text",
    "molmo2", "paligemma", "pi0", "pi05", "unlimited_ocr",
)  # fmt: skip
# The configs of models of those families built with "fa4cache" (id -> weak reference): a
# wrapper hands its mask maker a text config of another family's type (PaliGemma's is
# Gemma's), so the config object itself is what is known. (dynamo reads ids and weak
# references; a config cannot be hashed.)
_BLOCK_CONFIGS: dict[int, Any] = {}


def mark_block_family(model: Any) -> None:
    """Remember ``model``'s configs (its own and those it holds) if its class is one of
    :data:`BLOCK_FAMILIES`' (a subclass of one counts)."""
    import weakref

    families = {
        c.__module__.split(".")[2]
        for c in type(model).__mro__
        if c.__module__.startswith("transformers.models.")
    }
    config = getattr(model, "config", None)
    if config is None or families.isdisjoint(BLOCK_FAMILIES):
        return
    for dead in [k for k, ref in _BLOCK_CONFIGS.items() if ref() is None]:
        del _BLOCK_CONFIGS[dead]
    for c in (config, *(v for v in vars(config).values() if _is_config(v))):
        _BLOCK_CONFIGS[id(c)] = weakref.ref(c)


def _is_config(v: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(v, PretrainedConfig)


def block_family(config: Any) -> bool:
    ref = _BLOCK_CONFIGS.get(id(config))
    if ref is not None and ref() is config:
        return True
    model_type = getattr(config, "model_type", None) or ""
    return any(model_type == f or model_type.startswith(f + "_") for f in BLOCK_FAMILIES)  # gemma3_text


# What the attention layers of a model built with "fa4cache" say of their causality, by the
# config object they hold (id -> (weak reference, True: all say causal, False: all say not)).
# The FA4 path takes causality from the layer (``is_causal``, True where a layer says
# nothing), as transformers' flash attention does; eager and sdpa take it from the mask the
# model built. Where the two disagree (PEGASUS-X's and NLLB-MoE's decoders and PaliGemma's
# Gemma say is_causal=False under a causal mask; Splinter's layers say nothing under a
# bidirectional one), only the mask is what eager computes.
_LAYER_CAUSALITY: dict[int, tuple[Any, bool]] = {}
_CALLS_THE_INTERFACE: dict[type, bool] = {}


def mark_layer_causality(model: Any) -> None:
    """Remember, for each config object ``model``'s attention layers hold, whether all of them
    say they are causal or all say they are not (mixed: nothing is remembered; an
    encoder-decoder's layers share one config). Attention layers are the modules whose
    ``forward`` names ``ALL_ATTENTION_FUNCTIONS`` (read from its code object)."""
    import weakref

    said: dict[int, tuple[Any, set[bool]]] = {}
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is None or not _calls_the_interface(type(m)):
            continue
        claim = getattr(m, "is_causal", True)  # (the adapter's reading of a layer that says nothing)
        if isinstance(claim, bool):
            said.setdefault(id(config), (config, set()))[1].add(claim)
    for dead in [k for k, (ref, _) in _LAYER_CAUSALITY.items() if ref() is None]:
        del _LAYER_CAUSALITY[dead]
    for key, (config, claims) in said.items():
        if len(claims) == 1:
            _LAYER_CAUSALITY[key] = (weakref.ref(config), claims.pop())
        else:
            _LAYER_CAUSALITY.pop(key, None)


def _calls_the_interface(cls: type) -> bool:
    hit = _CALLS_THE_INTERFACE.get(cls)
    if hit is None:
        import inspect

        forward = getattr(cls, "forward", None)
        # (Under transformers' decorators, deprecate_kwarg's and others: functools.wraps.)
        code = getattr(inspect.unwrap(forward), "__code__", None) if callable(forward) else None
        hit = code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names
        _CALLS_THE_INTERFACE[cls] = hit
    return hit


def causality_disagrees(kwargs: dict[str, Any]) -> str | None:
    """Why the mask asked for is not the one the FA4 path would read from the layers that get
    it (None: it is). The mask makers that build a bidirectional mask are the only ones that
    pass ``allow_is_bidirectional_skip``; the others build causal ones (chunked, sliding)."""
    config = kwargs.get("config")
    hit = _LAYER_CAUSALITY.get(id(config))
    if hit is None or hit[0]() is not config:
        return None
    bidirectional = "allow_is_bidirectional_skip" in kwargs
    if hit[1] and bidirectional:
        return "a bidirectional mask for layers that say is_causal=True or nothing"
    if not hit[1] and not bidirectional:
        return "a causal mask for layers that say is_causal=False"
    return None
