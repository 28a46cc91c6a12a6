"""One process of ``tests/adapters/fa4/test_export_only_gpu.py``: a document-mask forward and
backward through FA4 on the GPU, with fa4cache installed on the store ``FA4CACHE_DIR``.

Saves the output and gradients to ARGV[1] (``torch.save``) and prints ``RESULT <json>``: how
many kernels this process compiled, and how many ran from the bytes they had just published
(a kernel compiled without the DSL's JIT engine, ``adapters/fa4/export_only.py``).
"""

from __future__ import annotations

import json
import sys

from fa4cache.adapters.fa4.compile_cache import StoreCompileCache

import fa4cache

store = fa4cache.install()
published: list[str] = []
_load = StoreCompileCache.load_published


def _counted(self, key, ref, compiled):  # type: ignore[no-untyped-def]  (instrumentation only)
    published.append(self.kind)
    return _load(self, key, ref, compiled)


StoreCompileCache.load_published = _counted  # type: ignore[method-assign]

import torch  # noqa: E402
from flash_attn.cute import flash_attn_func  # noqa: E402

from fa4cache.masks import make_document_mask  # noqa: E402

g = torch.Generator(device="cuda").manual_seed(1234)
T, H, HKV, D = 2048, 8, 2, 128
cu = torch.tensor([0, 300, 1100, 2048], device="cuda", dtype=torch.int32)
mask = make_document_mask(cu, seqlen=T)
q = torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
k = torch.randn(1, T, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
v = torch.randn(1, T, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
dout = torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
outs = []
for _ in range(2):  # the second call runs what the first left in memory
    for t in (q, k, v):
        t.grad = None
    out = flash_attn_func(q, k, v, **mask)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dout)
    outs.append([out.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()])
torch.cuda.synchronize()
# (the forward is deterministic; the backward's dq accumulates in any order)
assert torch.equal(outs[0][0], outs[1][0]), "a second call gave another output"
torch.save(outs[0], sys.argv[1])
store.counters.flush()
c = store.counters.values
print(
    "RESULT "
    + json.dumps(
        {"compiles": int(c["compiles"]), "disk_hits": int(c["disk_hits"]), "published_run": published}
    )
)
