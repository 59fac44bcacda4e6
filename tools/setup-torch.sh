#!/usr/bin/env bash
# Creates the Python virtual environment the torch examples (tools/python_client/examples/torch_paged_cache.py,
# hf_dynamic_cache.py; tests/vectors/torch_fp8_driver.py) run in: CPU torch and transformers, each pinned to one
# version, and numpy. CPU wheels come from PyTorch's CPU
# index when this machine reaches it (torch 2.5.1+cpu, a download of about 175 MB); otherwise from PyPI (torch 2.5.1,
# whose Linux x86_64 wheel pulls the nvidia-* CUDA runtime packages: a 5.2 GB venv, unused on a machine without a GPU).
# Idempotent: a venv that already imports the pinned torch is left alone.
#
#   bash tools/setup-torch.sh [DIR]        (default: build/venv-torch)
#
# Exit 0 ready; 77 no package index could be reached (the caller skips and says so: nothing was tested); 1 anything
# else (no python3 that makes a venv, a package that no longer installs: a real failure).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-build/venv-torch}
# The version docs/python.md reports on; it installs on Debian 12's python3.11 (x86_64). Change both together.
want_torch=2.5.1
want_transformers=4.46.3 # the version hf_dynamic_cache.py was checked with (docs/python.md)
cpu_index=https://download.pytorch.org/whl/cpu

check_torch() {
  "$venv/bin/python" - "$want_torch" <<'PY' >/dev/null 2>&1
import sys
import numpy, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] and torch.zeros(2).add(1).sum().item() == 2 else 1)
PY
}
check() {
  check_torch && "$venv/bin/python" -c "import sys, transformers; sys.exit(transformers.__version__ != sys.argv[1])" \
    "$want_transformers" >/dev/null 2>&1
}

if [ -x "$venv/bin/python" ] && check; then
  echo "[torch] $venv ready (torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'), transformers $want_transformers)"
  exit 0
fi
# A venv with the pinned torch but not transformers (made before transformers was part of it): add it only.
if [ -x "$venv/bin/python" ] && check_torch; then
  echo "[torch] $venv: pip install transformers==$want_transformers"
  if "$venv/bin/pip" install --disable-pip-version-check --no-input --timeout 30 --retries 2 \
       "transformers==$want_transformers" >"$venv/pip-install-transformers.log" 2>&1 && check; then
    echo "[torch] $venv ready (torch $want_torch, transformers $want_transformers)"
    exit 0
  fi
  echo "[torch] adding transformers failed (see $venv/pip-install-transformers.log); making the venv again" >&2
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
  echo "[torch] no python3 here can create a virtual environment with pip (Debian: apt-get install python3-venv)" >&2
  rm -rf "$venv"
  exit 1
fi

pip=("$venv/bin/pip" install --disable-pip-version-check --no-input --timeout 30 --retries 2)
log="$venv/pip-install.log"
# PyTorch's CPU index first (small, CPU only), when it answers within 10 s.
if "$venv/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=10)" \
     "$cpu_index" >/dev/null 2>&1; then
  echo "[torch] $venv from $made: pip install torch==$want_torch+cpu (from $cpu_index) numpy"
  if "${pip[@]}" --extra-index-url "$cpu_index" "torch==$want_torch+cpu" "numpy>=1.26,<3" "transformers==$want_transformers" >"$log" 2>&1 && check; then
    echo "[torch] $venv ready (torch $want_torch+cpu)"
    exit 0
  fi
  echo "[torch] the CPU index failed (see $log); trying PyPI" >&2
  mv "$log" "$log.cpu-index"
fi
echo "[torch] $venv from $made: pip install torch==$want_torch numpy (PyPI; with the CUDA runtime packages)"
if "${pip[@]}" "torch==$want_torch" "numpy>=1.26,<3" "transformers==$want_transformers" >"$log" 2>&1 && check; then
  echo "[torch] $venv ready (torch $want_torch)"
  exit 0
fi
tail -n 20 "$log" >&2
# Unreachable registry (no network, DNS, proxy) versus a real failure: only the first is a reason to skip.
if grep -Eq "NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|ConnectTimeout|ProxyError|Network is unreachable|Could not fetch URL" "$log"; then
  echo "[torch] no package index can be reached from this machine; nothing was installed" >&2
  rm -rf "$venv"
  exit 77
fi
echo "[torch] pip install failed (see $log)" >&2
exit 1
