"""``dst[rows] += src[rows]`` over the rows of a varlen call's sequences, and nowhere else.

The backward of a layout of several FA4 varlen calls adds each later call's dK/dV to the
first call's. A later call writes only the key rows of its own sequences (a prefix-LM's
prefix call: the prefixes, about a quarter of the tokens), so the add needs only those
rows. Adding whole tensors instead meant zeroing two full buffers first (FA4 leaves the
other rows unwritten) and reading and writing every row: at 64K tokens, 16 heads, d=128,
about 2 GB of memory traffic per backward, several percent of a prefix-LM step.

On CUDA this is one Triton kernel: a program per (block of rows, head) finds each row's
sequence by binary search over ``cu_seqlens`` and exits at once if no row of its block is
inside one, so the traffic follows the rows that are. Rows outside every sequence are
never read from ``src``, which may be uninitialised there. CPU tensors take an equivalent
PyTorch form; fake tensors (cross-compiling) are left as they are. Nothing syncs with the
host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


def add_sequences_(dst: Tensor, src: Tensor, cu_seqlens: Tensor, seqused: Tensor | None = None) -> Tensor:
    """Add ``src`` into ``dst`` (``[tokens, heads, dim]``, same shape) on the rows of the
    sequences ``[cu_seqlens[i], cu_seqlens[i] + len_i)``, ``len_i`` from ``seqused`` or
    the ``cu_seqlens`` differences. Returns ``dst``."""
    if dst.shape != src.shape or dst.dim() != 3:
        raise ValueError(
            f"src: shape {tuple(src.shape)} does not match dst {tuple(dst.shape)} (tokens, heads, dim)"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens: expected a 1-D tensor of at least 2 offsets, got {tuple(cu_seqlens.shape)}"
        )
    if dst.shape[0] == 0 or _is_fake(dst):
        # A fake tensor (cross-compiling FA4's kernels) has no values to add; a CPU torch
        # cannot even index a fake CUDA tensor.
        return dst
    if dst.device.type == "cuda":
        _launch(dst, src, cu_seqlens, seqused)
    else:
        dst.add_(_torch_masked(src, _rows_inside(dst.shape[0], cu_seqlens, seqused)))
    return dst


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return bool(is_fake(t))


def _rows_inside(n: int, cu_seqlens: Any, seqused: Any) -> Any:
    import torch

    rows = torch.arange(n, device=cu_seqlens.device)
    # Contiguous: cu_seqlens may be a strided view (a slice of a larger tensor), which
    # searchsorted would copy on every call, with a warning.
    cu = cu_seqlens.to(torch.int64).contiguous()
    seq = (torch.searchsorted(cu, rows, right=True) - 1).clamp(0, cu.numel() - 2)
    start = cu[seq]
    length = (cu[1:] - cu[:-1] if seqused is None else seqused.to(torch.int64))[seq]
    return (rows >= start) & (rows < start + length)


def _torch_masked(src: Tensor, inside: Tensor) -> Tensor:
    import torch

    # where, not a product: rows outside may hold nan or inf.
    return torch.where(
        inside.view(-1, 1, 1).to(src.device), src, torch.zeros((), dtype=src.dtype, device=src.device)
    )


def _launch(dst: Tensor, src: Tensor, cu_seqlens: Tensor, seqused: Tensor | None) -> None:
    import triton

    from . import sequence_add_triton as kernels

    n, heads, dim = dst.shape
    n_seq = cu_seqlens.numel() - 1
    # The kernel indexes both as dense 1-D arrays (a no-op for the layouts' own tensors).
    cu_seqlens = cu_seqlens.contiguous()
    seqused = None if seqused is None else seqused.contiguous()
    rows, cols = kernels.BLOCK_ROWS, triton.next_power_of_2(dim)
    grid = (triton.cdiv(n, rows), heads)
    kernels.add_sequences[grid](
        dst, src, cu_seqlens, cu_seqlens if seqused is None else seqused,
        n, n_seq, dim, *dst.stride(), *src.stride(),
        STEPS=n_seq.bit_length() + 1, HAS_USED=seqused is not None, BR=rows, BD=cols,
    )  # fmt: skip
