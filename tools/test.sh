#!/usr/bin/env bash
# README command 2: install what is missing, build, run the whole test suite with ctest, then the
# fuzzing stage, then the whole suite again under the sanitizers.
#   1. build/       (Release, g++): every test.
#   2. build-fuzz/  (clang, libFuzzer + ASan + UBSan): each parser's corpus replayed and fuzzed briefly with a fixed
#                   seed (tools/fuzz.sh ctest).
#   3. build-asan/  (g++ -O1, AddressSanitizer + UndefinedBehaviorSanitizer): the suite again, reduced case counts
#                   (tools/sanitize.sh says which and why). Measured times: docs/bad-input.md, "Sanitizer and fuzzing
#                   stages".
# KVCHECK_SKIP_SANITIZE=1 skips stages 2 and 3, for quick local runs; CI (.ci/run) never sets it.
# Random tests use fixed seeds here (each prints its seed; rerun one with the seed it printed).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash tools/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
echo "[test] ctest --test-dir build -j $jobs"
ctest --test-dir build -j "$jobs" --output-on-failure --output-junit ctest-junit.xml
echo "[test] stage 1 (build/) passed, $(( $(date +%s) - start )) s so far"
if [ "${KVCHECK_SKIP_SANITIZE:-0}" = 1 ]; then
  echo "[test] KVCHECK_SKIP_SANITIZE=1: the sanitizer and fuzzing stages were SKIPPED (not run, not passed)"
  exit 0
fi
# The fuzzing stage first: it is short; the sanitizer stage is the long one.
bash tools/fuzz.sh ctest
echo "[test] fuzzing stage (build-fuzz/) passed, $(( $(date +%s) - start )) s so far"
bash tools/sanitize.sh
echo "[test] all three stages passed, $(( $(date +%s) - start )) s in all"
