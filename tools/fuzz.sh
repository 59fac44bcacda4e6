#!/usr/bin/env bash
# Fuzzes the parsers of outside input with libFuzzer:
#   bash tools/fuzz.sh TARGET SECONDS     fuzz TARGET (replay result golden safetensors vectors_manifest
#                                         results_manifest pipe_reply, or all: each in turn) for SECONDS
#   bash tools/fuzz.sh ctest              the fuzzing stage of tools/test.sh: build every target and run ctest's
#                                         fuzz.* tests there (corpus replay, and a short run of each target with a
#                                         fixed seed and a fixed number of inputs: tests/fuzz/short_run.sh)
# Builds build-fuzz/ with clang, libFuzzer, ASan and UBSan (Debian's clang and libclang-rt-14-dev; tools/setup-deps.sh
# installs them). TARGET SECONDS fuzzes a scratch copy of tests/fuzz/corpus/TARGET (new inputs stay in
# build-fuzz/runs/) and exits 1 when it found a crash: the input is in build-fuzz/runs/TARGET/crashes/. Copy it into
# the corpus as a regression input (ctest replays the corpus in every build) and fix the parser.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(replay result golden safetensors vectors_manifest results_manifest pipe_reply)
usage="usage: bash tools/fuzz.sh TARGET|all SECONDS | bash tools/fuzz.sh ctest   (targets: ${targets[*]})"
if [ "${1:-}" = ctest ] && [ $# -eq 1 ]; then
  want=ctest
elif [ $# -ne 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
  echo "$usage" >&2
  exit 2
else
  want=$1 seconds=$2
fi
if [ "$want" != all ] && [ "$want" != ctest ]; then
  case " ${targets[*]} " in *" $want "*) targets=("$want") ;; *)
    echo "fuzz.sh: unknown target \"$want\" (targets: ${targets[*]})" >&2; exit 2 ;; esac
fi
bash tools/setup-deps.sh
dir=build-fuzz
mkdir -p "$dir"
log=$dir/fuzz-build.log
echo "[fuzz] cmake -S . -B $dir (clang, libFuzzer, address, undefined)"
CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKVCHECK_CUDA=OFF \
    -DKVCHECK_BUILD_BENCHMARKS=OFF -DKVCHECK_SANITIZE=fuzzer-no-link,address,undefined > "$log" 2>&1 ||
  { cat "$log"; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
# json_throughput: the strict JSON reader's linear-time check (fuzz.json.throughput), under the sanitizers too
cmake --build "$dir" -j "$jobs" --target "${targets[@]/#/fuzz_}" json_throughput >> "$log" 2>&1 ||
  { tail -n 60 "$log"; echo "[fuzz] build FAILED (full log: $log)"; exit 1; }

export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
if [ "$want" = ctest ]; then
  start=$(date +%s)
  echo "[fuzz] ctest --test-dir $dir -R '^fuzz\.' (KVCHECK_FUZZ_RUNS=${KVCHECK_FUZZ_RUNS:-default})"
  ctest --test-dir "$dir" -R '^fuzz\.' -j "$jobs" --output-on-failure --output-junit fuzz-junit.xml
  echo "[fuzz] clean, $(( $(date +%s) - start )) s"
  exit 0
fi
found=0
for t in "${targets[@]}"; do
  work=$dir/runs/$t
  mkdir -p "$work/corpus" "$work/crashes"
  cp -n tests/fuzz/corpus/"$t"/* "$work/corpus/"
  echo "[fuzz] $t for $seconds s (corpus: $work/corpus)"
  if ! "$dir/bin/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=25 -print_final_stats=1 \
       -artifact_prefix="$work/crashes/" "$work/corpus" > "$work/fuzz.log" 2>&1; then
    found=1
    tail -n 40 "$work/fuzz.log"
    echo "[fuzz] $t: FOUND A CRASH: $(ls "$work/crashes")"
  else
    echo "[fuzz] $t: $(grep -E '^stat::number_of_executed_units' "$work/fuzz.log" | awk '{print $2}') inputs, no crash"
  fi
done
exit $found
