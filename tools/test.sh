#!/usr/bin/env bash
# README command 2: install what is missing, build, run the whole test suite with ctest.
# Random tests use fixed seeds here (each prints its seed; rerun one with the seed it printed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
echo "[test] ctest --test-dir build -j $jobs"
ctest --test-dir build -j "$jobs" --output-on-failure --output-junit ctest-junit.xml
