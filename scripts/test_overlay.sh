#!/usr/bin/env bash
# Run tests against other versions of pure-Python packages without a second environment: their
# wheels, laid over ./.venv through PYTHONPATH (which Python searches before site-packages).
#
#   bash scripts/test_overlay.sh REQUIREMENT... -- PYTEST_ARGUMENTS...
#   bash scripts/test_overlay.sh transformers==5.17.0 "huggingface-hub>=1.5,<2" -- \
#       -q -n 2 tests/adapters/transformers/test_transformers.py -m "not slow"
#
# Each requirement is downloaded with `pip download --no-deps` (so list the dependencies whose
# installed version does not fit, as above) into build/overlay/ (git-ignored; kept, so a second
# run needs no network), then pytest runs with that folder first on PYTHONPATH. Before the
# tests, every `name==version` requirement is checked to be the version Python now imports.
# The exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
reqs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  reqs+=("$1")
  shift
done
if [ ${#reqs[@]} -eq 0 ] || [ $# -lt 2 ]; then
  echo "usage: bash scripts/test_overlay.sh REQUIREMENT... -- PYTEST_ARGUMENTS... (e.g. transformers==5.17.0 -- -q tests/adapters/transformers/test_transformers.py)" >&2
  exit 2
fi
shift # the --
# One folder per requirement list: a readable name, and a hash so that two lists never share one.
slug=$(printf '%s\n' "${reqs[@]}" | "$python" -c '
import hashlib, re, sys
reqs = sys.stdin.read().split()
name = re.sub(r"[^A-Za-z0-9.]+", "-", "_".join(reqs))[:60]
print(name + "-" + hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:8])')
dir=build/overlay/$slug
if [ ! -f "$dir/complete" ]; then
  rm -rf "$dir"
  mkdir -p "$dir/wheels"
  echo "overlay: downloading ${reqs[*]} into $dir"
  "$python" -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" "${reqs[@]}"
  "$python" -m pip install -q --no-deps --no-compile --target "$dir/site" "$dir"/wheels/*.whl
  touch "$dir/complete"
fi
site=$PWD/$dir/site
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} "$python" - "${reqs[@]}" <<'EOF'
import re
import sys
from importlib.metadata import version

# The overlay must be what Python imports: a pin that is not would test the wrong version.
for req in sys.argv[1:]:
    name = re.match(r"[A-Za-z0-9._-]+", req).group(0)
    pin = re.fullmatch(r"[A-Za-z0-9._-]+\s*==\s*(\S+)", req)
    have = version(name)
    if pin and have != pin.group(1):
        sys.exit(f"overlay: {name} imports as {have}, not {pin.group(1)}: installed where PYTHONPATH cannot shadow it?")
    print(f"overlay: {name} {have}")
EOF
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
exec "$python" -m pytest "$@"
