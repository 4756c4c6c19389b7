#!/usr/bin/env bash
# Nsight Compute profiles of the jagged HSTU attention forward, with and without its biases, on a GPU
# machine (docs/kernels.md says why): one report per variant of scripts/attention_profile_case.py
# (uniform 8,192, bf16; the third launch, after compilation and warm-up), plus its details page as CSV,
# packed into OUTDIR/ncu_attention.tgz. Clocks are left alone (--clock-control none). Needs ncu on PATH
# (or NCU=...) and FreeScale importable (PYTHONPATH: the GPU check's private install folder).
#   bash scripts/ncu_attention.sh OUTDIR [--dry-run]      # --dry-run: print the commands, run the case on CPU
set -euo pipefail
out="${1:?usage: scripts/ncu_attention.sh OUTDIR [--dry-run]}"
dry="${2:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
ncu="${NCU:-ncu}"
case_py="$root/scripts/attention_profile_case.py"
mkdir -p "$out/ncu_attention"
if [ "$dry" = "--dry-run" ]; then
  TRITON_INTERPRET=1 "$python" "$case_py" --device cpu --small --workload uniform_16 --variant time --launches 1
elif [ -n "$dry" ]; then
  echo "ncu_attention.sh: unknown option $dry (only --dry-run)" >&2; exit 2
elif ! command -v "$ncu" >/dev/null; then
  echo "ncu_attention.sh: $ncu not found (set NCU=/path/to/ncu)" >&2; exit 2
fi
for variant in time no_time no_bias; do
  report="$out/ncu_attention/fwd_$variant"
  cmd=("$ncu" --clock-control none --kernel-name regex:_hstu_fwd --launch-skip 2 --launch-count 1
       --set detailed --import-source no -f -o "$report" "$python" "$case_py" --variant "$variant" --launches 3)
  if [ "$dry" = "--dry-run" ]; then
    echo "${cmd[*]}"
    continue
  fi
  "${cmd[@]}" > "$report.log" 2>&1 || echo "ncu_attention.sh: $variant failed (see $report.log)" >&2
  [ -f "$report.ncu-rep" ] && "$ncu" -i "$report.ncu-rep" --page details --csv > "$report.csv" 2>>"$report.log" || true
done
[ "$dry" = "--dry-run" ] || tar czf "$out/ncu_attention.tgz" -C "$out" ncu_attention
echo "ncu_attention.sh: done; files in $out/ncu_attention"
