#!/usr/bin/env bash
# The GPU check, one bounded command for a lent offline GPU machine (logic: tools/gpu_check.py;
# README "Running on an offline GPU machine"):
#   bash scripts/gpu_check.sh OUTDIR [--dry-run] [--wheels DIR] [--parts a,b] [--deadline SECONDS]
# It installs .whl/ (scripts/gpu_wheels.sh made it) and FreeScale into a private folder, runs every
# part with its own timeout, writes one JSON per part plus summary.txt into OUTDIR and exits non-zero
# when a part failed. PYTHON picks the interpreter (default python3: on the GPU image, torch's).
set -euo pipefail
exec "${PYTHON:-python3}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/gpu_check.py" "$@"
