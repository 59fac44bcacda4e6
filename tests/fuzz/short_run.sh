#!/usr/bin/env bash
# ctest's short fuzzing run of one libFuzzer target: a fixed seed and a fixed number of inputs (not a time limit),
# on a scratch copy of the committed corpus. KVCHECK_FUZZ_RUNS overrides the count.
#   short_run.sh FUZZER CORPUS SCRATCH
set -euo pipefail
fuzzer=$1 corpus=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch/corpus" "$scratch/crashes"
cp "$corpus"/* "$scratch/corpus/"
exec "$fuzzer" -seed=1 -runs="${KVCHECK_FUZZ_RUNS:-20000}" -rss_limit_mb=4096 -artifact_prefix="$scratch/crashes/" \
     "$scratch/corpus"
