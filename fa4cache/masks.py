"""The public mask API in one place (each piece lives in a module of its own).

* :mod:`fa4cache.template`: ``@mask_template`` and the stable ``__cute_hash__``;
* :mod:`fa4cache.builtin_masks`: the interval and draft-block templates;
* :mod:`fa4cache.attention_mask`: :class:`AttentionMask`, what FA4 is given;
* :mod:`fa4cache.document_mask`, :mod:`fa4cache.draft_mask`: the mask builders;
* :mod:`fa4cache.mask_builder`: :class:`DocumentMaskBuilder` (CUDA-graph replay).
"""

from __future__ import annotations

from .attention_mask import AttentionMask
from .builtin_masks import draft_block_mask, interval_mask, interval_masking_enabled
from .document_mask import make_document_mask
from .draft_mask import make_draft_block_mask
from .mask_builder import DocumentMaskBuilder
from .template import ROW_INTERVALS_ATTR, MaskTemplate, mask_template

__all__ = [
    "ROW_INTERVALS_ATTR",
    "AttentionMask",
    "DocumentMaskBuilder",
    "MaskTemplate",
    "draft_block_mask",
    "interval_mask",
    "interval_masking_enabled",
    "make_document_mask",
    "make_draft_block_mask",
    "mask_template",
]
