#!/usr/bin/env bash
# The torch paged-cache example (tools/python_client/examples/torch_paged_cache.py) through --connect, full profile:
# `conformant` (the correct cache is CONFORMANT, 20 cases per property, 20 cases per client process), `fork_no_cow`
# (fork without copy-on-write: NOT CONFORMANT with FORK failing, full profile, 20 cases) or `release_frees_shared`
# (release frees blocks a fork still shares: NOT CONFORMANT with RELEASE or FORK failing, 20 cases each: every case
# of both ends with a release while a fork sibling shares, then takes the freed blocks again). For a broken one, the
# replay command kvcheck prints under the first failure of an expected property must reproduce the FAIL.
# The checks hf_conformant and hf_is_causal do the same with transformers' DynamicCache (hf_dynamic_cache.py):
# CONFORMANT, and with SDPA's top-left `is_causal` mask NOT CONFORMANT with EQUIV failing.
# Exit 77 (SKIPPED, with the reason) where the interpreter cannot import torch (and transformers, for hf_*):
# tools/setup-torch.sh makes build/venv-torch (nothing is downloaded from here).
set -uo pipefail
check=$1 kvcheck=$2 python=$3 client=$4 work=$5
example_file=torch_paged_cache.py imports="numpy, torch"
case $check in hf_*) example_file=hf_dynamic_cache.py imports="numpy, torch, transformers" check=${check#hf_} ;; esac
if [ ! -x "$python" ]; then
  echo "SKIPPED: no torch venv at $python (run: bash tools/setup-torch.sh, or configure with" \
       "-DKVCHECK_TORCH_PYTHON=...)"
  exit 77
fi
if ! "$python" -c "import $imports" 2>/dev/null; then
  echo "SKIPPED: $python cannot import $imports (run: bash tools/setup-torch.sh)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
example="$python $client/examples/$example_file"

if [ "$check" = conformant ]; then
  "$kvcheck" validate --connect "$example" --profile full --cases 20 --cases-per-process 20 --report r.json
  exit $?
fi

bug=${check//_/-}
case $check in
  fork_no_cow) expect="FORK" args=(--profile full --cases 20 --cases-per-process 20) ;;
  is_causal) expect="EQUIV" args=(--profile full --filter '^EQUIV$' --cases 10 --cases-per-process 20) ;;
  release_frees_shared) expect="RELEASE FORK"
    args=(--profile full --filter '^(RELEASE|FORK)$' --seed 20261129 --cases 20 --cases-per-process 20) ;;
  *) echo "unknown check $check"; exit 2 ;;
esac
"$kvcheck" validate --connect "$example --bug $bug" "${args[@]}" --report r.json >out.txt 2>&1
rc=$?
cat out.txt
[ $rc -eq 1 ] || { echo "expected exit 1 (not conformant), got $rc"; exit 1; }
grep -q "^overall: NOT CONFORMANT" out.txt || { echo "no 'overall: NOT CONFORMANT' line"; exit 1; }
"$python" - "$expect" <<'PY' || exit 1
import json, sys
props = json.load(open("r.json"))["implementations"][0]["properties"]
failing = sorted(p["id"] for p in props if p["counts"].get("FAIL", 0))
print("properties with a FAIL:", failing)
sys.exit(0 if set(sys.argv[1].split()) & set(failing) else 1)
PY
# The first failure of an expected property: its shrunk counterexample and the replay command printed under it.
block=$(awk -v want=" $expect " '
  /^FAIL / { split($2, a, "/"); on = index(want, " " a[1] " ") > 0 }
  on { print } on && /^  replay: / { exit }' out.txt)
echo "first expected failure:"; echo "$block"
grep -q "counterexample (shrunk in" <<<"$block" || { echo "no shrunk counterexample of $expect in the output"; exit 1; }
replay=$(sed -n 's/^  replay: //p' <<<"$block")
[ -n "$replay" ] || { echo "no replay command under the first failure of $expect"; exit 1; }
echo "replaying: $replay"
# kvcheck prints the command with the binary's bare name; run it with the one under test.
replay_out=$(eval "\"$kvcheck\" ${replay#kvcheck }" 2>&1)
replay_rc=$?
echo "$replay_out"
[ $replay_rc -eq 1 ] || { echo "expected the replay to exit 1 (FAIL reproduced), got $replay_rc"; exit 1; }
grep -q "^verdict: FAIL" <<<"$replay_out" || { echo "the replay did not reproduce the FAIL"; exit 1; }
echo "the replay reproduces the failure"
