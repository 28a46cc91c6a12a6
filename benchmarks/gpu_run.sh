#!/usr/bin/env bash
# The whole GPU run, on the lent H200 machine (two GPUs for the Ray part).
# Usage there, after the FA4 payload is installed:  bash benchmarks/gpu_run.sh PART [PART ...]
#   PART=tests   fuzz + GPU tests + mask benchmark (PART=pytest or PART=masks: one of the two;
#                GPU_TESTS_K=expr selects GPU tests as pytest -k does)
#   PART=store   store benchmark + Ray benchmark
#   PART=ray     Ray benchmark only (two GPUs)
#   PART=cluster the cluster-tier benchmark (two Ray nodes, one per GPU; issue 27)
#   PART=fuzz    the mask fuzz test only (tests/masks/test_fuzz_gpu.py, 8 processes)
#   PART=varlen  fa4cache.attention (per-document tiling) benchmark
#   PART=quack   training step with QuACK RMSNorm + cross-entropy + FA4 attention (bench_quack.py)
#   PART=cross   a bundle warmed on the CPU machine served here with 0 compiles (benchmarks/cross_host.py)
#   PART=cold    cold start in parallel (warm -j per kernel, compile-ahead, 4/8 cold processes), then the
#                run-time patch check at a first key (bench_patch_check.py)
#   PART=generation  generate / generate_batch on FA4: tests/adapters/transformers/test_generation_gpu.py + bench_generation.py
#                (GENERATION_BUDGET seconds, default 180; GENERATION_TESTS=0: no tests;
#                GENERATION_ARGS: the benchmark's options; GENERATION_BENCH=0: tests only)
#   TRANSFORMERS_WHEEL=path/to/transformers-X.whl (relative to the repo): every part on that transformers
#   PART=split    split decoding's attention in CUDA graphs against unsplit and sdpa (bench_decode_split.py)
#   PART=releases  per FA4 release in FA4_RELEASES (default "4.0.0b36 4.0.0b40"): switch FA4
#                (.gpu/b/use-fa4.sh), the mask GPU tests (RELEASE_TESTS_K: pytest -k), the transformers GPU
#                tests, and a second process that loads the first one's kernels; b40 runs with
#                FA4CACHE_TRY_COUPLINGS=$RELEASE_TRY (default interval_masking) to verify those couplings
#   PART=autotune  FA4 4.0.0b40's autotuner under fa4cache: two processes, one store (bench_autotune.py)
#   PART=transformers  training-step benchmark through transformers (fa4cache vs sdpa vs flex;
#                TRANSFORMERS_ARGS: its options, several runs separated by ';')
# The decode probes and profiles (profile/ladder/ranges/onerow) are archived, not run here:
# benchmarks/archive/2026-12-03/README.md.
set -uo pipefail
export PYTHONUNBUFFERED=1
parts=" ${*:-all} "
part=${1:-all}
has() { [[ $parts == *" $1 "* || $parts == *" all "* ]]; }
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$repo/out}
mkdir -p "$out"
# Results straight under $OUT: what a run cut short by the time limit measured still comes back.
res=$out/results
mkdir -p "$res"
export FA4CACHE_RESULTS=$res
site=/opt/fa4cache-site
# Always reinstall: a warm machine may still hold the previous call's copy.
rm -rf "$site" "$repo/build"
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target $site "$repo" || exit 3
if [ -f /opt/raystage/ray.part1 ] && ls "$repo"/.gpu/ray2/ray.part* >/dev/null 2>&1 && [ ! -d /opt/raysite/ray ]; then
  # Ray's wheel in parts (benchmarks/stage_ray.sh): part 1 staged by an earlier call, the rest carried now.
  whl=/tmp/ray-$(cat "$repo/.gpu/ray2/VERSION")-cp312-cp312-manylinux2014_x86_64.whl
  cat /opt/raystage/ray.part1 $(ls "$repo"/.gpu/ray2/ray.part* | sort -V) > "$whl"
  python3 -m pip install -q --no-index --no-deps --target /opt/raysite "$whl" "$repo"/.gpu/ray2/*.whl 2>&1 | tail -3 | tee -a "$out/run.log"
fi
export PYTHONPATH=$site:/opt/raysite:${PYTHONPATH:-}
if [ -n "${TRANSFORMERS_WHEEL:-}" ]; then
  # Another transformers than the image's (5.17), e.g. 5.24 (pure Python; carried as a wheel).
  rm -rf /opt/tfsite && python3 -m pip install -q --no-index --no-deps --target /opt/tfsite "$repo/$TRANSFORMERS_WHEEL" || exit 3
  export PYTHONPATH=/opt/tfsite:$PYTHONPATH
fi
tfver=$(python3 -c "import transformers; print(transformers.__version__)" 2>/dev/null)
echo "transformers $tfver" | tee -a "$out/run.log"
cd "$repo"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee -a "$out/run.log"
if has tests || has fuzz; then
  # The mask fuzz test: 8 shards in 8 processes (the kernels compile once, single-flight, in the store).
  start=$(date +%s)
  # Drawn here so that the log names it (pytest -q prints no header): FA4CACHE_FUZZ_SEED replays.
  export FA4CACHE_FUZZ_SEED=${FA4CACHE_FUZZ_SEED:-$(python3 -c "import random; print(random.SystemRandom().randrange(1 << 30))")}
  echo "FA4CACHE_FUZZ_SEED=$FA4CACHE_FUZZ_SEED" | tee -a "$out/run.log"
  (cd /tmp && python3 -m pytest -q -p no:cacheprovider --import-mode=importlib --rootdir "$repo" -c "$repo/pyproject.toml" \
     -o addopts="" -m gpu -n 8 "$repo/tests/masks/test_fuzz_gpu.py" > "$res/gpu_fuzz.log" 2>&1)
  # The whole log first, then the summary from it: a pipe into head would cut pytest short.
  grep -E "^(FAILED|ERROR|E  )|passed|failed|SEED" "$res/gpu_fuzz.log" | head -80 | tee -a "$out/run.log"
  echo "fuzz wall time: $(( $(date +%s) - start )) s, FA4CACHE_FUZZ_SEED=$FA4CACHE_FUZZ_SEED" | tee -a "$out/run.log" "$res/gpu_fuzz.log"
fi
if [[ $parts == *" releases "* ]]; then
  for rel in ${FA4_RELEASES:-4.0.0b36 4.0.0b40}; do
    # The release's wheel over /opt/fa4site (the payload's use-fa4.sh stops silently under
    # pipefail when a version's wheel is in only one of its two folders).
    w=$(ls "$repo"/.gpu/b/alt/flash_attn_4-"$rel"-*.whl "$repo"/.gpu/b/whl/flash_attn_4-"$rel"-*.whl 2>/dev/null | head -1)
    [ -n "$w" ] || { echo "no wheel for flash-attn-4 $rel" | tee -a "$out/run.log"; continue; }
    rm -rf /opt/fa4site/flash_attn /opt/fa4site/flash_attn_4-*.dist-info
    python3 -m pip install -q --no-index --no-deps --no-compile --target /opt/fa4site "$w" 2>&1 | tail -2
    python3 -c "import importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'))" 2>&1 | tee -a "$out/run.log"
    try=""
    [ "$rel" != 4.0.0b36 ] && try=${RELEASE_TRY-interval_masking}
    export FA4CACHE_TRY_COUPLINGS=$try
    echo "== flash-attn-4 $rel (FA4CACHE_TRY_COUPLINGS=$try)" | tee -a "$out/run.log"
    export FA4CACHE_DIR=/tmp/fa4cache-rel-$rel
    rm -rf "$FA4CACHE_DIR"
    [ "${RELEASE_TESTS:-1}" != 0 ] && (cd /tmp && timeout ${RELEASE_TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --import-mode=importlib --rootdir "$repo" -c "$repo/pyproject.toml" \
       -o addopts="" -m gpu ${RELEASE_TESTS_K:+-k "$RELEASE_TESTS_K"} "$repo/tests/masks/test_masks_gpu.py" "$repo/tests/adapters/transformers/test_transformers_gpu.py" "$repo/tests/adapters/fa4/test_export_only_gpu.py" > "$res/gpu_release_$rel.log" 2>&1)
    [ -f "$res/gpu_release_$rel.log" ] && grep -E "^(FAILED|ERROR|E  )|passed|failed" "$res/gpu_release_$rel.log" | head -30 | tee -a "$out/run.log"
    # Two processes, one store: the second loads every kernel the first compiled.
    rm -rf "$FA4CACHE_DIR"
    for i in 1 2; do
      (cd /tmp && PYTHONPATH=$site:$repo:$PYTHONPATH timeout 240 python3 -m tests.helpers.worker compile --seqlen 2048 2>&1 | grep -E "RESULT|Error" | tee -a "$out/run.log")
    done
    python3 -m fa4cache doctor 2>&1 | grep -E "release|compile_cache|interval" | tee -a "$out/run.log"
  done
  unset FA4CACHE_TRY_COUPLINGS FA4CACHE_DIR
fi
if [[ $parts == *" autotune "* ]]; then
  export FA4CACHE_DIR=/tmp/fa4cache-autotune
  rm -rf "$FA4CACHE_DIR"
  for i in 1 2; do
    (cd /tmp && timeout 200 python3 "$repo/benchmarks/bench_autotune.py" 2>&1 | grep -E "RESULT|Error|error" | tail -5 | tee -a "$out/run.log")
  done
  unset FA4CACHE_DIR
fi
if has tests || has pytest; then
  # From another directory, so that the installed fa4cache (with fa4cache.adapters) is imported,
  # not the source folder.
  (cd /tmp && python3 -m pytest -q -p no:cacheprovider --import-mode=importlib --rootdir "$repo" -c "$repo/pyproject.toml" \
     -o addopts="" -m gpu ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} "$repo/tests/masks/test_masks_gpu.py" "$repo/tests/adapters/transformers/test_transformers_gpu.py" "$repo/tests/adapters/fa4/test_export_only_gpu.py" > "$res/gpu_tests.log" 2>&1)
  grep -E "^(FAILED|ERROR|E  )|passed|failed" "$res/gpu_tests.log" | head -60 | tee -a "$out/run.log"
fi
if has tests || has masks; then
  timeout 540 python3 benchmarks/bench_masks.py 2>&1 | tail -70 | tee -a "$out/run.log"
fi
if has transformers; then
  # TRANSFORMERS_ARGS: the benchmark's options; several runs separated by ';'.
  IFS=';' read -ra runs <<< "${TRANSFORMERS_ARGS:-}"
  for args in "${runs[@]:-}"; do
    # shellcheck disable=SC2086
    timeout 560 python3 benchmarks/bench_transformers.py $args 2>&1 | grep -v Warning | tail -20 | tee -a "$out/run.log"
  done
fi
if has cross; then
  # A bundle made on the CPU machine with the README's install (benchmarks/cross_host.py's
  # docstring) serves generate, generate_batch and a training step here with 0 compiles.
  timeout ${CROSS_TIMEOUT:-300} python3 benchmarks/cross_host.py serve "${CROSS_BUNDLE:-out/cross/cpu.fa4b}" \
    "${CROSS_CONFIG:-out/cross}" 2>&1 | grep -v Warning | tail -60 | tee -a "$out/run.log"
fi
if has cold; then
  timeout ${COLD_TIMEOUT:-420} python3 benchmarks/bench_cold_start.py --gpu ${COLD_ARGS:-} 2>&1 | grep -v Warning | tail -40 | tee -a "$out/run.log"
  # the run-time patch check at a first key, on this host (about 20 s, most of it FA4's import)
  (cd benchmarks && timeout 60 python3 bench_patch_check.py --rounds 9 2>&1 | grep -v Warning | tail -8 | tee -a "$out/run.log")
fi
if has generation; then
  # Generation on FA4 (KV cache, continuous batching, CUDA graphs): GPU tests, then the benchmark.
  # GENERATION_BUDGET: the benchmark's seconds of measuring (default 180; imports and model
  # builds add ~30 s); GENERATION_TESTS=0 skips the GPU tests (GENERATION_TESTS_K: pytest -k;
  # GENERATION_TESTS_TIMEOUT, default 200 s); GENERATION_ARGS: more benchmark options.
  if [ "${GENERATION_TESTS:-1}" != 0 ]; then
    (cd /tmp && timeout ${GENERATION_TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider --import-mode=importlib --rootdir "$repo" -c "$repo/pyproject.toml" \
       -o addopts="" -m gpu --durations=8 ${GENERATION_TESTS_K:+-k "$GENERATION_TESTS_K"} "$repo/tests/adapters/transformers/test_generation_gpu.py" > "$res/gpu_generation_tests_tf$tfver.log" 2>&1)
    grep -E "^(FAILED|ERROR|E  )|passed|failed" "$res/gpu_generation_tests_tf$tfver.log" | head -40 | tee -a "$out/run.log"
  fi
  # The benchmark keeps to its budget and writes each row as it finishes; the timeout is a
  # backstop (on SIGTERM it writes its table and exits).
  if [ "${GENERATION_BENCH:-1}" != 0 ]; then
    gbudget=${GENERATION_BUDGET:-180}
    # shellcheck disable=SC2086
    timeout $(( gbudget + 90 )) python3 benchmarks/bench_generation.py --budget "$gbudget" ${GENERATION_ARGS:-} 2>&1 | grep -v Warning | tail -40 | tee -a "$out/run.log"
  fi
fi
if has split; then
  timeout ${SPLIT_TIMEOUT:-240} python3 benchmarks/bench_decode_split.py 2>&1 | grep -v Warning | tail -40 | tee -a "$out/run.log"
fi
if has varlen; then
  timeout 560 python3 benchmarks/bench_varlen.py 2>&1 | tail -60 | tee -a "$out/run.log"
fi
if has quack; then
  timeout 400 python3 benchmarks/bench_quack.py 2>&1 | tail -45 | tee -a "$out/run.log"
fi
if has store; then
  timeout 330 python3 benchmarks/bench_store.py 2>&1 | tail -40 | tee -a "$out/run.log"
fi
if has store || has ray; then
  if python3 -c "import ray" 2>"$res/ray_import.log"; then
    timeout 200 python3 benchmarks/bench_ray_gpu.py 2>&1 | tail -40 | tee -a "$out/run.log"
  else
    echo "ray not importable on this machine: Ray benchmark skipped" | tee -a "$out/run.log"; tail -5 "$res/ray_import.log" | tee -a "$out/run.log"
  fi
fi
if has cluster; then
  # Compile once per cluster: two Ray nodes on this host, one per GPU, separate node-local stores.
  timeout 240 python3 benchmarks/bench_cluster_gpu.py 2>&1 | grep -v Warning | tail -40 | tee -a "$out/run.log"
fi
ls "$res"
