#!/usr/bin/env bash
# Optional cross-check of the reference fp8 codes with ml_dtypes (Python). Runs with the first of these that can
# import ml_dtypes: the build's venv (tools/setup-venv.sh installs it there, beside onnxruntime), python3.
# Exit 77 (ctest SKIPPED, reason printed) when none can: nothing was compared. The C++ tests in test_quantize.cpp
# are the required proof; this only confirms them against a second implementation.
#   quantize_ml_dtypes.sh QUANTIZE_TABLE VENV
set -uo pipefail
table=$1 venv=$2
here=$(cd "$(dirname "$0")" && pwd)
py=""
for cand in "$venv/bin/python" python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import ml_dtypes, numpy" >/dev/null 2>&1; then
    py=$cand
    break
  fi
done
if [ -z "$py" ]; then
  echo "SKIPPED: neither $venv/bin/python nor python3 can import ml_dtypes and numpy, so the fp8 codes were not"
  echo "compared with ml_dtypes (run: bash tools/setup-venv.sh $venv)"
  exit 77
fi
echo "[ml_dtypes] using $py"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$table" >"$out" || { echo "FAILED: $table exited $?"; exit 1; }
exec "$py" -B "$here/quantize_ml_dtypes.py" <"$out"
