#!/usr/bin/env bash
# PyPI's torch float8 types as a KV cache's quantizer, graded through the vectors route (torch_fp8_driver.py): the
# cast after clamping to the format's largest finite value is CONFORMANT on fp8_e4m3 and fp8_e5m2 caches; the bare
# cast is NOT CONFORMANT, and every failure names the non-saturating conversion (torch makes NaN or an infinity
# where the ABI saturates). Exit 77 (SKIPPED, with the reason) where the interpreter cannot import torch:
# tools/setup-torch.sh makes build/venv-torch; nothing is downloaded from here.
#   torch_fp8.sh KVCHECK PYTHON WORK
set -uo pipefail
kvcheck=$1 python=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
if ! [ -x "$python" ] || ! "$python" -c "import numpy, torch; torch.float8_e4m3fn" 2>/dev/null; then
  echo "SKIPPED: $python cannot import torch with float8 types (run: bash tools/setup-torch.sh)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "FAILED: $*"; exit 1; }
cat > caps.json <<'JSON'
{"capabilities": ["dtype fp8_e4m3", "dtype fp8_e5m2", "fp8 scale per tensor", "fp8 scale per kv head", "rope neox",
                  "rope gptj", "gqa", "chunked", "fork", "release", "batch"]}
JSON
"$kvcheck" export --out vec --caps caps.json --dtypes fp8_e4m3,fp8_e5m2 --seed 20261206 --cases 20 \
  --properties EQUIV,CACHE-CONTENT,APPEND-ONLY,MEMORY,FORK,RELEASE,BATCH || fail "export exited $?"
driver="$python -B $here/torch_fp8_driver.py --example $here/../../tools/python_example --vectors vec"
$driver --results clamped || fail "the driver exited $?"
"$kvcheck" grade --vectors vec --results clamped > clamped.txt; rc=$?
cat clamped.txt
[ $rc -eq 0 ] || fail "the clamped cast graded rc $rc, not 0 (CONFORMANT)"
$driver --results bare --no-clamp || fail "the driver exited $?"
"$kvcheck" grade --vectors vec --results bare > bare.txt; rc=$?
cat bare.txt
[ $rc -eq 1 ] || fail "the bare cast graded rc $rc, not 1 (NOT CONFORMANT)"
failed=$(grep -cE '^  [A-Z-]+/[0-9]+ +FAIL' bare.txt)
named=$(grep -E '^  [A-Z-]+/[0-9]+ +FAIL' bare.txt | grep -c 'a non-saturating conversion')
[ "$failed" -gt 0 ] && [ "$failed" -eq "$named" ] || fail "$named of $failed failures name the non-saturating conversion"
echo "PASSED: clamped CONFORMANT; bare cast $failed FAIL, each naming the non-saturating conversion"
