#!/usr/bin/env bash
# Idempotent environment setup: creates .venv with the pinned FreeScale stack and installs the
# project in editable mode with its test extras. Re-running is cheap: a stamp file records the hash
# of the inputs that define the environment, and a matching stamp skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv
STAMP="$VENV/.freescale-setup-stamp"
# This machine's pip config adds a find-links folder whose torch build pip would prefer over the
# pinned PyPI one; point find-links at an empty folder so the registry decides.
EMPTY_FIND_LINKS="$(mktemp -d)"
export PIP_FIND_LINKS="$EMPTY_FIND_LINKS"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FBGEMM="fbgemm-gpu==1.9.0"
else
  FBGEMM="fbgemm-gpu-cpu==1.9.0"
fi

# Bytecode for the project's own modules (editable installs get none): where PYTHONDONTWRITEBYTECODE
# is set, as here, every process `prepare` spawns would otherwise compile ~6k lines again (0.13 s
# each). Cheap when nothing changed, so it runs on every call.
compile_project() {
  "$VENV/bin/python" -m compileall -q freescale pipeline trainer kernels datasets tools >/dev/null
}

want="$(cat scripts/setup.sh scripts/constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)-$FBGEMM"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  compile_project
  echo "setup: .venv is up to date"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --constraint scripts/constraints.txt)
echo "setup: installing the pinned stack into $VENV ($FBGEMM); first run takes a few minutes"
"${PIP[@]}" --upgrade pip setuptools wheel
"${PIP[@]}" torch==2.14.0 torchvision==0.29.0 "$FBGEMM"
# TorchRec's metadata asks for the CUDA fbgemm-gpu, whose library needs an NVIDIA driver: install it
# without dependencies and add the ones it really needs.
"${PIP[@]}" --no-deps torchrec==1.9.2
"${PIP[@]}" tensordict pyre-extensions iopath tqdm torchmetrics==1.0.3
"${PIP[@]}" -e ".[test]"
# The Triton of the GPU image (KINDS: torch 2.11 + Triton 3.6), beside the venv's own: the compile check
# (tests/kernels/test_triton_compile.py) builds every kernel for sm_90 with both, on hosts without a GPU.
[ -d "$VENV/triton-gpu-image/triton" ] ||
  "$VENV/bin/python" -m pip install --quiet --no-deps --target "$VENV/triton-gpu-image" triton==3.6.0
compile_project
echo "$want" > "$STAMP"
echo "setup: done"
