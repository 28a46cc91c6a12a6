"""Document masks (fa4cache/masks/document.py): input errors name the argument; prefixes and
flags are checked exactly where they go wrong.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

import fa4cache


def test_mask_input_errors_name_the_argument() -> None:
    mask = fa4cache.make_document_mask(torch.tensor([0, 212, 512]), seqlen=512)
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor .* got list"):
        mask.check([1, 2])
    with pytest.raises(TypeError, match=r"^seqlen: expected an int, got str '512'"):
        fa4cache.make_document_mask(torch.tensor([0, 512]), seqlen="512")
    for bad in (-1, 0):
        with pytest.raises(ValueError, match=rf"^seqlen: expected a positive int, got {bad}"):
            fa4cache.make_document_mask(torch.tensor([0, 512]), seqlen=bad)
    with pytest.raises(ValueError, match=r"^prefix_lengths: 999 for document 0, which has 212 tokens"):
        fa4cache.make_document_mask(torch.tensor([0, 212, 512]), prefix_lengths=torch.tensor([999, 3]))
    with pytest.raises(ValueError, match=r"^head_dim: FA4 supports head dims 1 to 256, got 512"):
        mask.for_head_dim(512)
    assert mask.for_head_dim(256) is not None


def test_prefix_longer_than_its_document_is_refused_exactly_then() -> None:
    # The space: random packings (cu_seqlens and 2-row document_ids) and prefixes around
    # each document's length; an error exactly when one exceeds it, else the reference mask.
    # Drawn in the test, not at collection (parallel workers must collect the same tests).
    seed = int(os.environ.get("FA4CACHE_TEST_SEED", random.randrange(2**31)))
    print(f"seed {seed} (FA4CACHE_TEST_SEED={seed} repeats it)")
    rng = random.Random(seed)
    for _ in range(25):
        rows = [[rng.randint(1, 40) for _ in range(rng.randint(1, 4))] for _ in range(2)]
        T = max(sum(r) for r in rows)
        rows = [r[:-1] + [r[-1] + T - sum(r)] for r in rows]  # both rows T tokens long
        pref = [[rng.choice([0, n // 2, n, n + 1, n + 7]) for n in r] for r in rows]
        too_long = any(p > n for r, pr in zip(rows, pref) for p, n in zip(pr, r))
        ids = torch.tensor([[d for d, n in enumerate(r) for _ in range(n)] for r in rows])
        width = max(len(r) for r in rows)
        p = torch.tensor([pr + [0] * (width - len(pr)) for pr in pref])
        cu = torch.tensor([0, *[sum(rows[0][: i + 1]) for i in range(len(rows[0]))]])
        for kw in (
            {"document_ids": ids, "prefix_lengths": p},
            {"cu_seqlens": cu, "prefix_lengths": p[0, : len(rows[0])]},
        ):
            bad = too_long if "document_ids" in kw else any(a > n for a, n in zip(pref[0], rows[0]))
            if bad:
                with pytest.raises(ValueError, match="^prefix_lengths: "):
                    fa4cache.make_document_mask(**kw)
            else:
                dense = fa4cache.make_document_mask(**kw).dense()
                for b, (r, pr) in enumerate(zip(rows, pref)):
                    if b >= dense.shape[0]:
                        break
                    start = 0
                    for n, pl in zip(r, pr):
                        for i in range(start, start + n):
                            hi = start + pl if i < start + pl else i + 1  # prefix: bidirectional
                            want = torch.zeros(T, dtype=torch.bool)
                            want[start:hi] = True
                            assert torch.equal(dense[b, i], want), (seed, r, pr, i)
                        start += n


@pytest.mark.parametrize("arg", ["causal", "block_sparse", "validate"])
def test_mask_flags_of_the_wrong_type_are_refused(arg: str) -> None:
    import torch

    from fa4cache import make_document_mask

    with pytest.raises(TypeError, match=f"^{arg}: expected True or False, got str 'yes'"):
        make_document_mask(document_ids=torch.zeros(1, 64, dtype=torch.long), **{arg: "yes"})
    # A run of equal ids is one document: [0, 1, 0] is three; -1 is not padding.
    m = make_document_mask(document_ids=torch.tensor([[0] * 8 + [1] * 8 + [0] * 8 + [-1] * 8]))
    assert m.varlen is not None and m.varlen.calls[0].cu_seqlens_q.tolist() == [0, 8, 16, 24, 32]
