#!/usr/bin/env bash
# Install fa4cache and everything its tests use into ./.venv (CPU machine, no GPU needed).
# torch is installed first and pinned: the CPU build; a bare "torch" would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
# One line per step, said before it starts (the downloads take minutes: the screen must not
# look hung), its time when it ends; a step's own output only when it fails (pip and
# setuptools notices, e.g. the one an editable install of a mapped package prints, are not
# what a newcomer's first screen should be).
step() {
  local what=$1 t0=$SECONDS
  shift
  printf '%s ... ' "$what"
  if ! "$@" >"$log" 2>&1; then
    echo "failed"
    cat "$log" >&2
    echo "install step failed: $*" >&2
    exit 1
  fi
  echo "done ($((SECONDS - t0)) s)"
}
step "[1/5] creating the virtual environment .venv" python3 -m venv .venv
step "[2/5] upgrading pip" .venv/bin/python -m pip install -q --upgrade pip
step "[3/5] installing torch 2.13.0, CPU build (about 200 MB)" .venv/bin/python -m pip install -q "torch==2.13.0"
step "[4/5] installing fa4cache (editable) with flash-attn-4 4.0.0b36, cutlass, quack, ray, transformers, pytest" \
  .venv/bin/python -m pip install -q -e ".[fa4,ray,transformers,test]" "flash-attn-4==4.0.0b36"
# An editable install's import hook loses to a folder named fa4cache in the current
# directory (python run next to the clone): scripts/link_checkout.py says why and fixes it.
step "[5/5] making this checkout win over a same-named folder (scripts/link_checkout.py)" \
  .venv/bin/python scripts/link_checkout.py
.venv/bin/python -c "import fa4cache, flash_attn.cute, ray; print('fa4cache', fa4cache.__version__, 'installed')"
echo "in $((SECONDS - start)) s; try: .venv/bin/fa4cache doctor"
