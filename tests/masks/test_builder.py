"""``DocumentMaskBuilder`` (fa4cache/masks/builder.py) on a machine without a GPU."""

from __future__ import annotations

import pytest
import torch

import fa4cache


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_builder_without_a_gpu_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"^device: .* no CUDA GPU is visible here; pass device='cpu'"):
        fa4cache.DocumentMaskBuilder(512, max_documents=8)
    with pytest.raises(TypeError, match="^seqlen: expected an int, got str"):
        fa4cache.DocumentMaskBuilder("512", max_documents=8, device="cpu")
    build = fa4cache.DocumentMaskBuilder(512, max_documents=8, device="cpu")
    assert build(torch.tensor([0, 100, 512])).seqlen == 512
