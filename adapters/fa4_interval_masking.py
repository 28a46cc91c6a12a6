"""Cheap masking of partial tiles for masks that are unions of per-row key intervals.

FA4 applies a ``mask_mod`` element by element: on Hopper, every partial tile of a
document mask calls the mask once per score (a compare, a select and the bounds
checks, for each of the 64 scores a thread holds), where FA4's own causal and
sliding-window masks compute two column limits per row and mask a whole row with
R2P bit masks. A packed document mask has about three times as many partial tiles as
varlen causal attention (the diagonal plus the tiles that straddle a document
boundary, both ways), so this per-element path is most of the gap between a
block-sparse document mask and FA4 varlen.

A ``mask_mod`` may declare the rows it keeps as intervals: an attribute
:data:`ROW_INTERVALS_ATTR` holding a ``@cute.jit`` function
``(batch_idx, head_idx, q_idx, seqlen_info, aux_tensors) -> ((lo, hi), ...)``
(``Int32`` scalars, half-open ``[lo, hi)``, one read of the aux tensors per row).
:func:`enable` patches FA4's Hopper ``AttentionMask.apply_mask`` so that such masks
take the causal/local code path: per row, the column limits of each interval are
turned into an R2P bit mask (or, in the backward's transposed layout, two compares
per score). Every other mask, and every other arch, goes through FA4's code
unchanged. The ``mask_mod`` itself stays a correct mask on its own, so a kernel traced
without the patch is only slower, never wrong; the masks' ``__cute_hash__`` covers
this module's source, so patched and unpatched kernels never share a cache key.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

ROW_INTERVALS_ATTR = "__fa4cache_row_intervals__"
# FA4's Hopper apply_mask signature this patch forwards to (flash-attn-4 4.0.0b36).
_EXPECTED_PARAMS = (
    "self", "acc_S", "batch_idx", "head_idx", "m_block", "n_block", "thr_mma", "mask_seqlen",
    "mask_causal", "mask_local", "mask_mod", "aux_data", "fastdiv_mods",
)  # fmt: skip
_PATCHED_MARK = "__fa4cache_interval_patch__"
_lock = threading.Lock()
# How many times a kernel trace took the interval path: tests read it to prove that a
# compile really went through it (the counter moves at trace time, on any machine).
trace_count = 0


def enable() -> bool:
    """Patch FA4's Hopper mask application (idempotent); ``False`` if FA4 is missing
    or its layout is not the one this patch was written for (4.0.0b36)."""
    try:
        from flash_attn.cute import mask as fa_mask
    except ImportError:
        return False
    cls = fa_mask.AttentionMask
    with _lock:
        if getattr(cls.apply_mask, _PATCHED_MARK, False):
            return True
        needed = ("sm90_col_to_r2p_idx", "r2p_bitmask_below", "r2p_bitmask_above", "mask_r2p_lambda")
        if not all(hasattr(fa_mask, n) for n in needed) or _params(cls.apply_mask) != _EXPECTED_PARAMS:
            log.warning("fa4cache: FA4's mask module has an unknown layout; interval masks use mask_mod")
            return False
        cls.apply_mask = _build_apply_mask(fa_mask, cls.apply_mask)
    return True


def _params(fn: Any) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(inspect.unwrap(fn)).parameters)
    except (TypeError, ValueError):
        return ()


def _build_apply_mask(fa_mask: Any, original: Any) -> Any:
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, const_expr
    from flash_attn.cute.utils import AuxData
    from quack import layout_utils

    def keep_bits(lefts: list[Any], rights: list[Any], s: int) -> Any:
        # R2P keep-mask of 32-column chunk ``s``: the union of the row's intervals.
        bits = fa_mask.r2p_bitmask_below(rights[0], s) & fa_mask.r2p_bitmask_above(lefts[0], s)
        for lo, hi in zip(lefts[1:], rights[1:]):
            bits = bits | (fa_mask.r2p_bitmask_below(hi, s) & fa_mask.r2p_bitmask_above(lo, s))
        return bits

    no_aux = AuxData()

    @cute.jit
    def apply_intervals(
        self: Any,
        acc_S: cute.Tensor,
        batch_idx: cutlass.Int32,
        head_idx: cutlass.Int32,
        m_block: cutlass.Int32,
        n_block: cutlass.Int32,
        thr_mma: cute.TiledMma,
        mask_seqlen: cutlass.Constexpr[bool],
        row_intervals: cutlass.Constexpr[Any],
        aux_data: AuxData,
    ) -> None:
        # Same coordinate bookkeeping as FA4's own mask_mod branch, so both layouts
        # (forward, and the backward's swap_AB) index rows and columns the same way.
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S, transpose=self.swap_AB)
        acc_shape = (self.tile_m, self.tile_n)
        cS = cute.make_identity_tensor(acc_shape if not self.swap_AB else acc_shape[::-1])
        tScS_mn = layout_utils.reshape_acc_to_mn(thr_mma.partition_C(cS), transpose=self.swap_AB)
        t0ScS_mn = layout_utils.reshape_acc_to_mn(
            thr_mma.get_slice(0).partition_C(cS), transpose=self.swap_AB
        )
        ROW = 0 if const_expr(not self.swap_AB) else 1
        COL = 1 if const_expr(not self.swap_AB) else 0
        thr_col_offset = tScS_mn[0][COL]
        if n_block < 0:
            n_block = 0
        col_base = n_block * self.tile_n + thr_col_offset
        seqlenk_col_limit = self.seqlen_k - col_base
        for r in cutlass.range_constexpr(cute.size(tScS_mn.shape[0])):
            row_idx = tScS_mn[r, 0][ROW] + m_block * self.tile_m
            spans = row_intervals(batch_idx, head_idx, row_idx, self.seqlen_info, aux_data.tensors)
            lefts = []
            rights = []
            for i in cutlass.range_constexpr(len(spans)):
                left = spans[i][0] - col_base
                right = spans[i][1] - col_base
                if const_expr(mask_seqlen):
                    right = cutlass.min(right, seqlenk_col_limit)
                    # A row past the sequence end keeps nothing (FA4's mask_mod path does the same).
                    right = right if row_idx < self.seqlen_q else left
                lefts.append(left)
                rights.append(right)
            if const_expr(not self.swap_AB):
                lefts_r2p = [fa_mask.sm90_col_to_r2p_idx(x) for x in lefts]
                rights_r2p = [fa_mask.sm90_col_to_r2p_idx(x) for x in rights]

                fa_mask.mask_r2p_lambda(
                    acc_S_mn[r, None], functools.partial(keep_bits, lefts_r2p, rights_r2p), rank1=True
                )
            else:
                for c in cutlass.range_constexpr(cute.size(tScS_mn.shape[1])):
                    col = t0ScS_mn[0, c][COL]
                    keep = col >= lefts[0] and col < rights[0]
                    for j in cutlass.range_constexpr(1, len(lefts)):
                        keep = keep or (col >= lefts[j] and col < rights[j])
                    acc_S_mn[r, c] = acc_S_mn[r, c] if keep else -Float32.inf

    def apply_mask(
        self: Any,
        acc_S: Any,
        batch_idx: Any,
        head_idx: Any,
        m_block: Any,
        n_block: Any,
        thr_mma: Any,
        mask_seqlen: bool,
        mask_causal: bool,
        mask_local: bool = False,
        mask_mod: Any = None,
        aux_data: Any = no_aux,
        fastdiv_mods: Any = (None, None),
    ) -> None:
        # Plain Python: runs while the kernel is traced and picks the code to emit.
        row_intervals = getattr(mask_mod, ROW_INTERVALS_ATTR, None)
        if (
            row_intervals is None
            or mask_causal
            or mask_local
            or self.qhead_per_kvhead_packgqa != 1
            or aux_data.tensors is None
        ):
            return original(
                self, acc_S, batch_idx, head_idx, m_block, n_block, thr_mma, mask_seqlen,
                mask_causal, mask_local, mask_mod, aux_data, fastdiv_mods,
            )  # fmt: skip
        global trace_count
        trace_count += 1
        return apply_intervals(
            self, acc_S, batch_idx, head_idx, m_block, n_block, thr_mma, mask_seqlen, row_intervals, aux_data
        )

    setattr(apply_mask, _PATCHED_MARK, True)
    return apply_mask
