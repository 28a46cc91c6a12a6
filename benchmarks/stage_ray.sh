#!/usr/bin/env bash
# Ray is not on the GPU image and one device call carries at most 64 MiB: split its wheel
# (and the dependencies the image lacks) over two folders, each carried by its own call.
#   here:                         bash benchmarks/stage_ray.sh            (after ../shared/gpu/pack.sh)
#   call with carry [".gpu/b", ".gpu/ray1"]: bash .gpu/b/install.sh && mkdir -p /opt/raystage && cp .gpu/ray1/ray.part1 /opt/raystage/
#   call with carry [".gpu/ray2"]:           . /opt/fa4site/env.sh && bash benchmarks/gpu_run.sh ...   (installs Ray)
set -euo pipefail
cd "$(dirname "$0")/.."
ver=$(.venv/bin/python -c "import ray; print(ray.__version__)")
mkdir -p .gpu/raywhl && rm -rf .gpu/ray1 .gpu/ray2 && mkdir -p .gpu/ray1 .gpu/ray2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .gpu/raywhl "ray==$ver" jsonschema jsonschema-specifications referencing rpds-py attrs msgpack click
split -b 36000000 -d -a 1 ".gpu/raywhl/ray-$ver-cp312-cp312-manylinux2014_x86_64.whl" .gpu/ray.part
mv .gpu/ray.part0 .gpu/ray1/ray.part1
for i in 1 2 3 4; do [ -f ".gpu/ray.part$i" ] && mv ".gpu/ray.part$i" ".gpu/ray2/ray.part$((i + 1))"; done
echo "$ver" > .gpu/ray2/VERSION
find .gpu/raywhl -name '*.whl' ! -name 'ray-*' -exec cp {} .gpu/ray2/ \;
du -sh .gpu/ray1 .gpu/ray2
