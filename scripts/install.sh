#!/usr/bin/env bash
# Install fa4cache and everything its tests use into ./.venv (CPU machine, no GPU needed).
# torch is installed first and pinned: the CPU build; a bare "torch" would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# A step's output only when it fails: pip and setuptools notices (an editable install of a
# mapped package directory prints one) are not what a newcomer's first screen should be.
quiet() {
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "install step failed: $*" >&2
    exit 1
  fi
}
quiet python3 -m venv .venv
quiet .venv/bin/python -m pip install -q --upgrade pip
quiet .venv/bin/python -m pip install -q "torch==2.13.0"
quiet .venv/bin/python -m pip install -q -e ".[fa4,ray,transformers,test]"
.venv/bin/python -c "import fa4cache, flash_attn.cute, ray; print('fa4cache', fa4cache.__version__, 'installed')"
