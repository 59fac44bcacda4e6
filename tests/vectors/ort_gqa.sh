#!/usr/bin/env bash
# ONNX Runtime's CPU GroupQueryAttention graded by kvcheck: sets up the venv (pip), then runs E2E (default
# ort_gqa_e2e.py; ort_gqa_window_e2e.py for local_window_size). Exit 77 (ctest SKIP, with the reason printed) only
# when PyPI cannot be reached.
#   ort_gqa.sh KVCHECK VENV WORK [E2E]
set -uo pipefail
kvcheck=$1 venv=$2 work=$3 e2e=${4:-ort_gqa_e2e.py}
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/../../tools/setup-venv.sh" "$venv"
rc=$?
if [ $rc -eq 77 ]; then
  echo "SKIPPED: PyPI cannot be reached, so onnxruntime cannot be installed; ONNX Runtime was not graded"
  exit 77
fi
[ $rc -eq 0 ] || { echo "FAILED: tools/setup-venv.sh exited $rc"; exit 1; }
exec "$venv/bin/python" -B "$here/$e2e" --kvcheck "$kvcheck" --work "$work"
