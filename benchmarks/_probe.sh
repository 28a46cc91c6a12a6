# One H200 call after .gpu/a/stage.sh: install, then bench_cold_start's parts named in $PARTS
# (default "step procs"), each under its own time limit; results in $OUT/results.
set -u
R=$(pwd)
bash .gpu/b/install.sh 2>&1 | tail -1
. /opt/fa4site/env.sh
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /opt/fa4cache-site . 2>&1 | tail -2
export PYTHONPATH=/opt/fa4cache-site:$PYTHONPATH FA4CACHE_RESULTS=$OUT/results PYTHONUNBUFFERED=1
mkdir -p $OUT/results
[ -n "${PROBE:-}" ] && timeout 200 python3 benchmarks/$PROBE 2>&1 | grep -v Warning | tail -40
for part in ${PARTS-step procs}; do
  limit=330; [ "$part" = procs ] && limit=220
  timeout $limit python3 benchmarks/bench_cold_start.py --gpu --parts $part --rounds 3 2>&1 | grep -v Warning | grep -E "^round|profile|Error|error" | tail -40
  cp $OUT/results/cold_start_h200.md $OUT/results/cold_start_h200.$part.md 2>/dev/null
  cp $OUT/results/cold_start_h200.json $OUT/results/cold_start_h200.$part.json 2>/dev/null
done
