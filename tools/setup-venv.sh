#!/usr/bin/env bash
# Creates the Python virtual environment the ONNX Runtime driver (tools/ort_driver) runs in, with the pinned
# onnxruntime, onnx and numpy from PyPI, and ml_dtypes (the fp8 cross-check, tests/reference/quantize_ml_dtypes.sh).
# Idempotent: a venv that already imports the pinned versions is left alone.
#
#   bash tools/setup-venv.sh [DIR]        (default: build/venv)
#
# Exit 0 ready; 77 PyPI could not be reached (the caller skips and says so: nothing was tested); 1 anything else
# (a broken venv, a package that no longer installs: a real failure).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-build/venv}
# The versions docs/real-implementations.md reports on. A newer ORT may compute differently: change both together.
# ml_dtypes: onnx already requires it (>=0.5.4); pinned so the fp8 codes are compared with one known version.
pins=("onnxruntime==1.31.1" "onnx==1.23.2" "numpy>=1.26,<3" "ml_dtypes==0.7.0")
want_ort=1.31.1
want_onnx=1.23.2
want_mld=0.7.0

check() {
  "$venv/bin/python" - "$want_ort" "$want_onnx" "$want_mld" <<'EOF' >/dev/null 2>&1
import sys
import ml_dtypes, numpy, onnx, onnxruntime
sys.exit(0 if (onnxruntime.__version__, onnx.__version__, ml_dtypes.__version__) == tuple(sys.argv[1:4]) else 1)
EOF
}

if [ -x "$venv/bin/python" ] && check; then
  echo "[venv] $venv ready (onnxruntime $want_ort, onnx $want_onnx, ml_dtypes $want_mld)"
  exit 0
fi

# A python3 that can create a venv with pip in it: $KVCHECK_VENV_PYTHON, python3 on PATH, Debian's.
made=""
for py in ${KVCHECK_VENV_PYTHON:-} python3 /usr/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  rm -rf "$venv"
  if "$py" -m venv "$venv" >/dev/null 2>&1 && [ -x "$venv/bin/pip" ]; then
    made=$py
    break
  fi
done
if [ -z "$made" ]; then
  echo "[venv] no python3 here can create a virtual environment with pip (Debian: apt-get install python3-venv)" >&2
  rm -rf "$venv"
  exit 1
fi

echo "[venv] $venv from $made: pip install ${pins[*]}"
log="$venv/pip-install.log"
if "$venv/bin/pip" install --disable-pip-version-check --no-input --timeout 30 --retries 2 "${pins[@]}" >"$log" 2>&1 &&
   check; then
  echo "[venv] $venv ready (onnxruntime $want_ort, onnx $want_onnx, ml_dtypes $want_mld)"
  exit 0
fi
tail -n 20 "$log" >&2
# Unreachable registry (no network, DNS, proxy) versus a real failure: only the first is a reason to skip.
if grep -Eq "NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|ConnectTimeout|ProxyError|Network is unreachable|Could not fetch URL" "$log"; then
  echo "[venv] PyPI cannot be reached from this machine; nothing was installed" >&2
  rm -rf "$venv"
  exit 77
fi
echo "[venv] pip install failed (see $log)" >&2
exit 1
