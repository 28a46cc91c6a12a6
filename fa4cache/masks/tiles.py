"""FA4's block-sparse tiles per target arch: the defaults masks use, and what FA4 accepts.

FA4 4.0.0b36 requires a block-sparse tile whose query side is a multiple of the kernel's
query tile (times its Q stages) and whose key side is a multiple of its key tile:

========  ==================  ======================================================
arch      forward (q, k)      backward (q, k)
========  ==================  ======================================================
sm_90     (128, 128)          (128, 128); (64, 128) also valid for head_dim 65-128
sm_100+   (256, 128): two     (128, 256): the key side covers two 128-key tiles, so
          Q stages of 128     the backward can run 2-CTA (required for head_dim 192)
========  ==================  ======================================================

The defaults serve head dims up to 128. On sm_90 FA4's kernels take narrower key tiles
past that, and a block-sparse key side must equal the backward's key tile: 96 for head
dim 129-192, 64 for 193-256 (:func:`head_dim_tiles`). A mask is built before it sees
``q``, on the defaults; :meth:`fa4cache.AttentionMask.for_head_dim` rebuilds its metadata
on these tiles (``fa4cache.attention`` and, after ``install()``, ``flash_attn_func(q, k, v,
**mask)`` call it for you).

A test cross-compiles the defaults with FA4 and checks that FA4 rejects what
:func:`check_tile` rejects. The target arch is ``FLASH_ATTENTION_ARCH`` when set (a
cross-compile), else the arch of the CUDA device the mask is built on, else sm_90.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fa4cache.arch import resolved_arch

DEFAULT_MASK_ARCH = 90
# FA4 4.0.0b36's largest head dim (q/k), on every arch.
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class TileRule:
    fwd: tuple[int, int]  # the default forward tile
    bwd: tuple[int, int]  # the default backward tile
    fwd_multiple: tuple[int, int]  # a forward tile must be a multiple of these
    bwd_multiple: tuple[int, int]


RULES = {
    9: TileRule((128, 128), (128, 128), (64, 128), (64, 128)),
    10: TileRule((256, 128), (128, 256), (256, 128), (128, 128)),
    11: TileRule((256, 128), (128, 256), (256, 128), (128, 128)),
}


def target_arch(device: Any = None) -> int:
    """The arch masks are built for (:func:`fa4cache.arch.resolved_arch`), else sm_90: a mask
    built where nothing names a target (a CPU machine, for its dense reference) gets the
    tiles of the part most users train on."""
    return resolved_arch(device) or DEFAULT_MASK_ARCH


def rule_for(arch: int) -> TileRule:
    rule = RULES.get(arch // 10)
    if rule is None:
        known = ", ".join(f"sm_{k}x" for k in RULES)
        raise ValueError(
            f"sparse_tile: no block-sparse tile rule for sm_{arch} (known: {known}); pass block_sparse=False"
        )
    return rule


def default_tiles(arch: int) -> tuple[tuple[int, int], tuple[int, int]]:
    rule = rule_for(arch)
    return rule.fwd, rule.bwd


def check_head_dim(head_dim: Any, *, name: str = "head_dim") -> int:
    """``head_dim`` if FA4 runs it, else ``ValueError`` naming ``name`` and the range."""
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        raise ValueError(f"{name}: expected a positive int, got {head_dim!r}")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"{name}: FA4 supports head dims 1 to {MAX_HEAD_DIM}, got {head_dim}")
    return head_dim


def head_dim_tiles(arch: int, head_dim: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The (forward, backward) tiles FA4 needs for ``head_dim`` (of q and k) where the
    arch's defaults do not fit it; ``None`` where they do.

    On sm_90 (FA4 4.0.0b36) the backward's key tile is 128 up to head dim 128, 96 up to
    192 (whatever the value dim) and 64 (with block sparsity) up to 256, and the sparse key
    side must equal it; the forward shrinks its own key tile (112 or 128, 80 at 256) to a
    narrower sparse one.
    """
    check_head_dim(head_dim)
    if arch // 10 != 9 or head_dim <= 128:
        return None
    key = 96 if head_dim <= 192 else 64
    return (128, key), (128, key)


def check_tile(tile: Any, arch: int, *, name: str, backward: bool = False) -> tuple[int, int]:
    """``tile`` as a pair of ints, or ``ValueError`` naming the argument and the valid sizes."""
    rule = rule_for(arch)
    mq, mk = rule.bwd_multiple if backward else rule.fwd_multiple
    try:
        q, k = (int(x) for x in tile)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected (query, key) ints, got {tile!r}") from None
    if q <= 0 or k <= 0 or q % mq or k % mk:
        example = rule.bwd if backward else rule.fwd
        raise ValueError(
            f"{name}: FA4 on sm_{arch} needs a {'backward' if backward else 'forward'} block-sparse tile "
            f"whose query side is a multiple of {mq} and key side a multiple of {mk} "
            f"(default {example}); got {tuple(tile)}"
        )
    return q, k


def resolve_tiles(
    sparse_tile: Any, bwd_sparse_tile: Any, device: Any = None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (forward, backward) tiles of a mask: the given ones, checked, else the target
    arch's defaults. A given forward tile without a backward one serves both, as before."""
    arch = target_arch(device)
    fwd_default, bwd_default = default_tiles(arch)
    fwd = check_tile(sparse_tile, arch, name="sparse_tile") if sparse_tile is not None else fwd_default
    if bwd_sparse_tile is not None:
        bwd = check_tile(bwd_sparse_tile, arch, name="bwd_sparse_tile", backward=True)
    elif sparse_tile is not None:
        bwd = check_tile(sparse_tile, arch, name="sparse_tile", backward=True)
    else:
        bwd = bwd_default
    return fwd, bwd
