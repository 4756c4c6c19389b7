#!/usr/bin/env bash
# Download the wheels the GPU check needs beyond the GPU image (scripts/gpu_wheels.txt says which and
# why) for CPython 3.12 on manylinux x86_64, into DIR (default .whl; its old *.whl files are removed
# first, so it holds one version of each). Needs a package index; run it on a connected machine, then
# carry DIR to the GPU machine. Fails when a wheel is missing or the total passes 60 MiB.
#   bash scripts/gpu_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir="${1:-.whl}"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
mkdir -p "$dir"
rm -f "$dir"/*.whl
# This machine's pip config may add a find-links folder of local builds: let the index decide.
empty="$(mktemp -d)"
trap 'rmdir "$empty"' EXIT
PIP_FIND_LINKS="$empty" PIP_DISABLE_PIP_VERSION_CHECK=1 "$python" -m pip download --quiet \
  --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --dest "$dir" -r scripts/gpu_wheels.txt
"$python" tools/gpu_check.py --verify-wheels "$dir"
