"""fa4cache on torch.distributed: the job's c10d store as a remote tier
(:mod:`.tier`), and a cold job's kernel set compiled across its nodes (:mod:`.split`).

Importing this package registers the tier under the name ``"distributed"``, which
``FA4CACHE_DISTRIBUTED=1`` (``install(distributed=True)``) picks; torch loads only once a
store builds it and a process group exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fa4cache.store.remote import register_tier


def _tier(root: Path) -> Any:
    from fa4cache.adapters.distributed.tier import DistributedTier

    return DistributedTier(root)


register_tier("distributed", _tier)
