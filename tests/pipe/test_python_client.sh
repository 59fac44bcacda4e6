#!/usr/bin/env bash
# The Python client's numpy example through --connect: `conformant` (the correct cache passes the core profile),
# `keep_q` (the cache that keeps every query fails NO-Q, and only NO-Q), or `pytest` (the pytest entry on both, in
# tools/python_client/tests). Exit 77 (SKIPPED) without numpy, or for `pytest` without pytest.
set -uo pipefail
check=$1 kvcheck=$2 python=$3 client=$4 work=$5
if ! "$python" -c "import numpy" 2>/dev/null; then
  echo "SKIPPED: $python cannot import numpy (install python3-numpy, or configure with -DKVCHECK_PYTHON=...)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
if [ "$check" = pytest ]; then
  if ! "$python" -c "import pytest" 2>/dev/null; then
    echo "SKIPPED: $python cannot import pytest (install python3-pytest)"
    exit 77
  fi
  deselect=()
  if [ "${KVCHECK_TEST_WATCH_BLIND:-0}" = 1 ]; then
    echo "note: the Q-keeping cache's test is left out: the allocator watch is blind under AddressSanitizer"
    deselect=(-k "not q_keeping")
  fi
  KVCHECK="$kvcheck" PYTHONPATH="$client${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -m pytest -p kvcheck_client.pytest_plugin -p no:cacheprovider -q "${deselect[@]}" "$client/tests"
  exit $?
fi
if [ "$check" = keep_q ] && [ "${KVCHECK_TEST_WATCH_BLIND:-0}" = 1 ]; then
  echo "SKIPPED: the allocator watch is blind under AddressSanitizer: a kept query cannot fail NO-Q in this build"
  exit 77
fi
example="$python $client/examples/numpy_cache.py"
if [ "$check" = conformant ]; then
  "$kvcheck" validate --connect "$example" --profile core --cases 8 --report r.json
  exit $?
fi
"$kvcheck" validate --connect "$example --bug keep-q" --profile core --cases 4 --report r.json
rc=$?
[ $rc -eq 1 ] || { echo "expected exit 1 (not conformant), got $rc"; exit 1; }
"$python" - <<'PY'
import json, sys
props = json.load(open("r.json"))["implementations"][0]["properties"]
failing = sorted(p["id"] for p in props if p["counts"].get("FAIL", 0))
print("properties with a FAIL:", failing)
sys.exit(0 if failing == ["NO-Q"] else 1)
PY
