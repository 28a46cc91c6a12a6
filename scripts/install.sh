#!/usr/bin/env bash
# Install fa4cache and everything its tests use into ./.venv (CPU machine, no GPU needed).
# torch is installed first and pinned: the CPU build; a bare "torch" would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[fa4,ray,transformers,test]"
.venv/bin/python -c "import fa4cache, flash_attn.cute, ray; print('fa4cache', fa4cache.__version__, 'installed')"
