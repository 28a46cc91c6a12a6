"""The mask object handed to FA4, and the input checks shared by the mask builders."""

from __future__ import annotations

import dataclasses
import operator
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fa4cache.masks.intervals import BIG  # noqa: F401  (re-exported for the mask builders)

if TYPE_CHECKING:
    from torch import Tensor

# Aux tensors are padded to this many rows past the sequence end: kernels may
# evaluate the mask for out-of-range rows of the last tile before discarding them.
ROW_PAD = 256
_KEYS = ("mask_mod", "aux_tensors", "block_sparse_tensors", "block_sparse_tensors_bwd")

# Block-sparse metadata object (by id) -> the mask holding it: FA4's entry points receive
# only the metadata, and find the mask here to fit it to the call's head dim
# (fa4cache.adapters.fa4.mask_tiles). Weak: a mask's lifetime is its user's business.
_OWNERS: weakref.WeakValueDictionary[int, AttentionMask] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class AttentionMask(Mapping[str, Any]):
    """Keyword arguments for ``flash_attn_func``: ``flash_attn_func(q, k, v, **mask)``.

    ``intervals`` holds the per-row key intervals ``(lo, hi)``, each ``[B, K, T]``, that
    define the mask; :meth:`dense` expands them into a boolean reference.
    """

    mask_mod: Callable[..., Any]
    aux_tensors: list[Any]
    block_sparse_tensors: Any
    block_sparse_tensors_bwd: Any
    seqlen: int
    batch: int
    name: str
    intervals: tuple[Any, Any] = field(repr=False)
    # The documents as FA4 varlen sequences (document masks only): see fa4cache.masks.varlen.
    varlen: Any = field(default=None, repr=False)
    # True for a DocumentMaskBuilder's masks: a graph replay rewrites their tensors in
    # place for each new packing, so nothing derived from them may be cached.
    rewritten_in_place: bool = field(default=False, repr=False)
    # for_head_dim's masks, by tiles: a model's layers reuse one mask.
    _fitted: dict[Any, AttentionMask] = field(default_factory=dict, init=False, repr=False, compare=False)
    _base: AttentionMask | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for t in (self.block_sparse_tensors, self.block_sparse_tensors_bwd):
            if t is not None:
                _OWNERS[id(t)] = self

    @staticmethod
    def owning(block_sparse_tensors: Any) -> AttentionMask | None:
        """The live mask whose forward or backward metadata is this very object, if any."""
        mask = _OWNERS.get(id(block_sparse_tensors))
        if mask is None:
            return None
        if (
            block_sparse_tensors is mask.block_sparse_tensors
            or block_sparse_tensors is mask.block_sparse_tensors_bwd
        ):
            return mask
        return None

    def __repr__(self) -> str:
        # Shapes, not contents: a mask's tensors are as long as the batch.
        def shape(t: Any) -> str:
            return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" if hasattr(t, "shape") else repr(t)

        def tiles(bs: Any) -> str:
            return "None" if bs is None else str(tuple(bs.block_size))

        varlen = "" if self.varlen is None else f", varlen={len(self.varlen.calls)} call(s)"
        return (
            f"AttentionMask(name={self.name!r}, batch={self.batch}, seqlen={self.seqlen}, "
            f"aux_tensors=[{', '.join(shape(t) for t in self.aux_tensors)}], "
            f"sparse_tile={tiles(self.block_sparse_tensors)}, "
            f"bwd_sparse_tile={tiles(self.block_sparse_tensors_bwd)}{varlen})"
        )

    def for_head_dim(self, head_dim: int) -> AttentionMask:
        """This mask with its block-sparse metadata on the tiles FA4 uses for ``head_dim``
        (of q and k): ``self`` where they already fit, else a copy whose metadata is
        rebuilt from the same intervals (once; later calls return the same copy, except
        for a builder's mask, whose tensors change in place: rebuilt on every call).

        Masks are built on the tiles of head dims up to 128; on sm_90, 192 and 256 need
        narrower key tiles (:func:`fa4cache.masks.tiles.head_dim_tiles`). :func:`fa4cache.attention`
        calls this, and so does ``flash_attn_func(q, k, v, **mask)`` after ``install()``;
        without ``install()``, write ``flash_attn_func(q, k, v, **mask.for_head_dim(192))``.
        """
        if self._base is not None:  # a fitted copy: fit the mask as built
            return self._base.for_head_dim(head_dim)
        from .tiles import head_dim_tiles, target_arch

        want = head_dim_tiles(target_arch(self.aux_tensors[0].device), head_dim)
        if want is None or self.block_sparse_tensors is None:
            return self
        have = (tuple(self.block_sparse_tensors.block_size), tuple(self.block_sparse_tensors_bwd.block_size))
        if have == want:
            return self
        fitted = self._fitted.get(want)
        if fitted is None:
            from .blocksparse import block_sparse_tensors

            fwd, bwd = block_sparse_tensors(
                *self.intervals,
                seqlen_q=self.seqlen,
                seqlen_k=self.seqlen,
                block_size=want[0],
                bwd_block_size=want[1],
            )
            fitted = dataclasses.replace(self, block_sparse_tensors=fwd, block_sparse_tensors_bwd=bwd)
            object.__setattr__(fitted, "_base", self)
            if not self.rewritten_in_place:
                self._fitted[want] = fitted
        return fitted

    def __getitem__(self, key: str) -> Any:
        if key not in _KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_KEYS)

    def __len__(self) -> int:
        return len(_KEYS)

    def varlen_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``flash_attn_varlen_func`` on ``[B * T, heads, head_dim]``
        tokens (per-document tiling); ``ValueError`` for a mask that is not per-document."""
        if self.varlen is None:
            raise ValueError(
                f"mask {self.name!r} is not a per-document mask: use flash_attn_func(q, k, v, **mask)"
            )
        return self.varlen.kwargs()

    def dense(self) -> Tensor:
        """Boolean ``[B, T, T]`` tensor: ``True`` where query row may attend to key column."""
        import torch

        lo, hi = self.intervals
        T = self.seqlen
        n = torch.arange(T, device=lo.device).view(1, 1, 1, T)
        lo_ = lo[..., :T].unsqueeze(-1)
        hi_ = hi[..., :T].unsqueeze(-1)
        return ((n >= lo_) & (n < hi_)).any(1)

    def check(self, q: Any) -> None:
        """Raise ``ValueError`` if this mask does not fit ``q`` (``[B, T, H, D]``), ``TypeError``
        if ``q`` is not a tensor."""
        if not hasattr(q, "dim") or not hasattr(q, "shape") or not hasattr(q, "device"):
            raise TypeError(
                f"q: expected a torch.Tensor [batch, seqlen, heads, head_dim], got {type(q).__name__}"
            )
        if q.dim() != 4:
            raise ValueError(f"q: expected [batch, seqlen, heads, head_dim], got shape {tuple(q.shape)}")
        from .tiles import check_head_dim

        if isinstance(q.shape[3], int):  # a symbolic size (torch.compile) is checked where it is known
            check_head_dim(q.shape[3], name="q: head_dim (q.shape[3])")
        if q.shape[0] != self.batch or q.shape[1] != self.seqlen:
            raise ValueError(
                f"q: shape {tuple(q.shape)} does not match the mask's batch={self.batch}, "
                f"seqlen={self.seqlen} (total length of the packed documents)"
            )
        dev = self.aux_tensors[0].device
        if q.device != dev:
            raise ValueError(
                f"q is on {q.device} but the mask's tensors are on {dev}: build the mask on q's device"
            )


def as_int_tensor(x: Any, name: str, device: Any = None) -> Any:
    import torch

    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, device=device)
        except Exception as e:
            raise ValueError(f"{name}: expected an integer tensor or sequence, got {type(x).__name__}") from e
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name}: expected an integer dtype, got {x.dtype}")
    if x.device.type == "meta":
        raise ValueError(
            f"{name}: a tensor on the meta device holds no values to build a mask from; "
            "give it on the CPU or on q's GPU (to trace without data, use FakeTensorMode)"
        )
    return x


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a bool: ``TypeError`` naming ``name`` for anything else. ``causal="yes"``
    (or ``"false"``, which is truthy) would otherwise pick a mask silently."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy's bool too
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {type(value).__name__} {value!r}")


def check_length(value: Any, name: str) -> int | None:
    """``value`` as a positive int (None stays None): ``TypeError`` naming ``name`` for a
    non-integer (``'512'``, ``512.0``), ``ValueError`` for zero or a negative length."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got bool {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}") from None
    if n <= 0:
        raise ValueError(f"{name}: expected a positive int, got {n}")
    return n


def check_int32(x: Any, name: str) -> None:
    if x.numel() and (int(x.max()) >= 2**31 or int(x.min()) < -(2**31)):
        raise ValueError(f"{name}: values do not fit in int32")


def pad_rows(t: Tensor, value: int) -> Tensor:
    import torch

    return torch.nn.functional.pad(t, (0, ROW_PAD), value=value).contiguous()
