"""The public mask API in one place (each piece lives in a module of its own).

* :mod:`fa4cache.masks.template`: ``@mask_template`` and the stable ``__cute_hash__``;
* :mod:`fa4cache.masks.builtins`: the interval and draft-block templates;
* :mod:`fa4cache.masks.mask`: :class:`AttentionMask`, what FA4 is given;
* :mod:`fa4cache.masks.document`, :mod:`fa4cache.masks.draft`: the mask builders;
* :mod:`fa4cache.masks.builder`: :class:`DocumentMaskBuilder` (CUDA-graph replay).
"""

from __future__ import annotations

from fa4cache.extras import require

# Masks are torch tensors and CuTe mask_mods: without the [fa4] extra, the error names it
# (`pip install 'fa4cache[fa4]'`), not the first missing module.
require("fa4cache's masks (make_document_mask and friends)", "torch", "cutlass")

from fa4cache.masks.builder import DocumentMaskBuilder  # noqa: E402
from fa4cache.masks.builtins import draft_block_mask, interval_mask, interval_masking_enabled  # noqa: E402
from fa4cache.masks.document import make_document_mask  # noqa: E402
from fa4cache.masks.draft import make_draft_block_mask  # noqa: E402
from fa4cache.masks.mask import AttentionMask  # noqa: E402

from .template import ROW_INTERVALS_ATTR, MaskTemplate, mask_template  # noqa: E402

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
