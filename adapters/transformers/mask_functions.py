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


def not_computed_while_tracing(kwargs: dict[str, Any]) -> str | None:
    """:func:`not_computed` from what torch.compile lets a traced hook read (it cannot look
    into closures): transformers turns ``use_vmap`` on exactly when the model passed its own
    ``or_mask_function``/``and_mask_function``; a chunked layer's ``local_size`` is the
    config's ``attention_chunk_size``. (Gemma 3's image blocks come with neither: transformers
    compiles decode steps, whose new tokens are text, and those are the same.)"""
    if kwargs.get("use_vmap"):
        return "a mask widened or narrowed by the model's own mask function"
    chunk = getattr(kwargs.get("config"), "attention_chunk_size", None)
    if chunk is not None and kwargs.get("local_size") == chunk:
        return "chunked attention (attention_chunk_size)"
    return None
