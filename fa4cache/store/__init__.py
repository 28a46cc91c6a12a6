"""The persistent kernel store: directory layout, trust checks, locks, entries, upkeep.

Knows nothing about FA4: artifacts are opaque bytes. What reads and writes them lives in
:mod:`fa4cache.store.store`; the lookup order over store tiers in :mod:`.tiers`.
"""

from fa4cache.store.paths import EntryRef
from fa4cache.store.store import Artifact, Store

__all__ = ["Artifact", "EntryRef", "Store"]
