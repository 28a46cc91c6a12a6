"""One process of bench_cold_start.py's model part: the first training step of
bench_transformers' Qwen3-style model through transformers (attn_implementation="fa4cache"),
timed from after the model is on the GPU, on a fresh store (GPU).

    python benchmarks/_cold_model_step.py T LAYERS

FA4CACHE_COMPILE_AHEAD and FA4CACHE_DIR come from the environment. Prints
``RESULT <json>``: the first and second step's seconds, the store's counters, and the seconds
from the model's construction to its first step (the head start compile-ahead had).
"""

from __future__ import annotations

import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")
T, layers = int(sys.argv[1]), int(sys.argv[2])
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch  # noqa: E402
from bench_transformers import batch, load  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import fa4cache  # noqa: E402

cfg = load(layers)
_, ids, pos = batch(T, cfg.vocab_size, [128, 4096])
torch.manual_seed(0)
t_built = time.perf_counter()
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4cache", dtype=torch.bfloat16).cuda()
model.train()
torch.cuda.synchronize()


def step() -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = model(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
    loss.backward()
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


head_start = time.perf_counter() - t_built
first = step()
second = step()
from fa4cache.adapters.patch import fold_all_hits  # noqa: E402

store = fa4cache.install()
fold_all_hits()
store.counters.flush()
print(
    "RESULT "
    + json.dumps(
        {"first_s": first, "second_s": second, "head_start_s": head_start, "counters": store.counters.values}
    ),
    flush=True,
)
