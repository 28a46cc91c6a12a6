"""The one choice of how a KV-cache step runs: :func:`choose`, reading the three decode
switches through :func:`fa4cache.settings.decode_switches`.

A layer's step is asked about twice at most: by the caller (the transformers adapter, eager
or traced), and, where that chose the custom op, by the op's body when it runs (under
torch.compile, inside its CUDA graphs). The answer is a :class:`Choice`; :mod:`.kv_cache`
runs it.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any

from fa4cache.settings import decode_switches

from . import launch_plans, one_row_sdpa, split_kv


class Strategy(enum.Enum):
    ONE_ROW_SDPA = "one-row sdpa"  # eager, one row without padding: PyTorch's SDPA kernel (.one_row_sdpa)
    OP = "op"  # traced by torch.compile: one opaque custom op (.op), whose body asks again as it runs
    SPLIT_KV = (
        "split-KV"  # the op's body, one query over a long cache: FA4 over key chunks, combined (.split_kv)
    )
    LANES = "lanes"  # eager FA4, launch plans on: the layer kind's lane (.lanes), else a replay or a plan
    FA4 = "fa4"  # one FA4 call over the step's key ranges (replayed from a plan where plans are on)


@dataclass(frozen=True)
class Choice:
    """A step's strategy; ``split``: :attr:`Strategy.SPLIT_KV`'s ``(chunks, keys per chunk)``."""

    strategy: Strategy
    split: tuple[int, int] | None = None

    @property
    def checks_mask(self) -> bool:
        """Whether the step's key ranges come from its mask (checked once per step and kind of
        layer): every strategy but SDPA's, which reads the mask itself."""
        return self.strategy is not Strategy.ONE_ROW_SDPA


ONE_ROW_SDPA, OP, LANES, FA4 = (
    Choice(s) for s in (Strategy.ONE_ROW_SDPA, Strategy.OP, Strategy.LANES, Strategy.FA4)
)


@functools.lru_cache(maxsize=64)
def _split(splits: int, chunk: int) -> Choice:
    return Choice(Strategy.SPLIT_KV, (splits, chunk))


def choose(
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    window: int | None,
    softcap: float | None,
    *,
    traced: bool = False,
    eager: bool = True,
    plain: bool = True,
) -> Choice:
    """How the step of ``query [B, Hq, Tq, D]`` over the cache ``key``/``value`` ``[B, Hkv,
    Tk, D]`` runs. ``window``: FA4's (keys before the query), None for none. ``traced``:
    torch.compile traces the call (asked first: nothing else is traced). ``eager``: the
    caller is eager code, whose layers may share a step's state; False for the op's body.
    ``plain``: the step is a model's self-attention over its own cache (``generate``'s
    decode), the only kind that may run on SDPA.

    * traced: :data:`OP`;
    * the op's body: split-KV for one query without a window over a long cache at small
      batch (:func:`split_plan`; ``FA4CACHE_DECODE_SPLIT``), else :data:`FA4`;
    * eager: SDPA for one row of one query without padding, window or softcap
      (:mod:`.one_row_sdpa`; ``FA4CACHE_ONE_ROW_SDPA``), else :data:`LANES` where launch
      plans are on (``FA4CACHE_LAUNCH_PLANS`` on a verified FA4), else :data:`FA4`.

    Cheap: it runs in every layer of every decode step, where host time is the step's time."""
    if traced:
        return OP
    if not eager:
        if query.shape[2] == 1 and window is None:
            split = split_plan(
                query.shape[0] * key.shape[1], key.shape[2], max(query.shape[-1], value.shape[-1])
            )
            if split is not None:
                return _split(*split)
        return FA4
    if (
        plain
        and query.shape[0] == 1
        and query.shape[2] == 1
        and window is None
        and not softcap
        and attention_mask is not None
        and attention_mask.shape[-1] == key.shape[2]
        and decode_switches().one_row_sdpa
        and one_row_sdpa.takes(query, key, value)
        and one_row_sdpa.all_ones(attention_mask)
    ):
        return ONE_ROW_SDPA
    return LANES if launch_plans.enabled() else FA4


def split_plan(sequences: int, keys: int, head_dim: int) -> tuple[int, int] | None:
    """:func:`.split_kv.plan` for this device, unless ``FA4CACHE_DECODE_SPLIT=0`` or
    ``head_dim`` (the larger of the query's and the value's) is past
    :data:`.split_kv.MAX_HEAD_DIM`."""
    from fa4cache.arch import num_sms_or_none

    # The integer bounds first: this runs in every layer of a compiled step without graphs.
    if head_dim > split_kv.MAX_HEAD_DIM or keys < split_kv.MIN_KEYS:
        return None
    if not decode_switches().split:
        return None
    sms = num_sms_or_none()
    if sms is None:
        return None
    return split_kv.plan(sequences, keys, sms)
