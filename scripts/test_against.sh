#!/usr/bin/env bash
# Run tests against other releases of pure-Python dependencies, laid over ./.venv.
#
#   bash scripts/test_against.sh 'flash-attn-4==4.0.0b40' -- -q tests/unit/test_fa4_releases.py
#   bash scripts/test_against.sh 'transformers==5.17.0,huggingface-hub==1.0.0' -- -q tests/integration
#
# The first argument lists PKG==VERSION specs (comma-separated). They are installed without
# their dependencies into .overlays/<specs>/ (once; the folder is reused) and put first on
# PYTHONPATH, so the venv's other packages stay as they are: the same tests run against one
# more release of FA4 or transformers with nothing else changed. The rest after `--` goes to
# pytest as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
specs=${1:?usage: scripts/test_against.sh PKG==VER[,PKG==VER] -- PYTEST_ARGS}
shift
[ "${1:-}" = "--" ] && shift
dir=.overlays/$(printf '%s' "$specs" | tr -c 'A-Za-z0-9.=_-' '_')
if [ ! -f "$dir/.complete" ]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  IFS=, read -r -a list <<<"$specs"
  .venv/bin/python -m pip install -q --no-deps --no-compile --target "$dir" "${list[@]}"
  touch "$dir/.complete"
fi
echo "== tests against ${specs} (overlay $dir)"
PYTHONPATH="$PWD/$dir${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python -m pytest "$@"
