#!/usr/bin/env bash
# Fuzzes one parser of outside input (or all) with libFuzzer for a given time:
#   bash tools/fuzz.sh TARGET SECONDS     TARGET: replay result golden safetensors vectors_manifest
#                                         results_manifest, or all (each for SECONDS)
# Builds build-fuzz/ with clang, libFuzzer, ASan and UBSan (Debian's clang and libclang-rt-*-dev; tools/setup-deps.sh
# installs them), fuzzes a scratch copy of tests/fuzz/corpus/TARGET (new inputs stay in build-fuzz/runs/), and
# exits 1 when it found a crash: the input is in build-fuzz/runs/TARGET/crashes/. Copy it into the corpus as a
# regression input (ctest replays the corpus in every build) and fix the parser.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(replay result golden safetensors vectors_manifest results_manifest)
if [ $# -ne 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: bash tools/fuzz.sh TARGET|all SECONDS   (targets: ${targets[*]})" >&2
  exit 2
fi
want=$1 seconds=$2
if [ "$want" != all ]; then
  case " ${targets[*]} " in *" $want "*) targets=("$want") ;; *)
    echo "fuzz.sh: unknown target \"$want\" (targets: ${targets[*]})" >&2; exit 2 ;; esac
fi
KVCHECK_WITH_FUZZ=1 bash tools/setup-deps.sh
dir=build-fuzz
mkdir -p "$dir"
log=$dir/fuzz-build.log
echo "[fuzz] cmake -S . -B $dir (clang, libFuzzer, address, undefined)"
CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKVCHECK_CUDA=OFF \
    -DKVCHECK_BUILD_BENCHMARKS=OFF -DKVCHECK_SANITIZE=fuzzer-no-link,address,undefined > "$log" 2>&1 ||
  { cat "$log"; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$dir" -j "$jobs" --target "${targets[@]/#/fuzz_}" >> "$log" 2>&1 ||
  { tail -n 60 "$log"; echo "[fuzz] build FAILED (full log: $log)"; exit 1; }

export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
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
