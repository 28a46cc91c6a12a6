"""Attention calls on FA4's kernels: ``fa4cache.attention`` and what it runs on (varlen call
layouts, the per-sequence add, the transformers custom op and its per-step mask)."""
