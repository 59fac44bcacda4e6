#!/usr/bin/env bash
# The one GPU check: run on a machine with an NVIDIA GPU. It runs the CUDA tests (label "cuda") of an existing build
# and prints a short table last. Build on a development machine first (nvcc is there, the GPU machine may have no
# package archive): `bash tools/build.sh`, then copy or carry build/ to the GPU machine and run this script there.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -d "$build" ] || { echo "gpu-check: no build folder '$build' (build with tools/build.sh first)"; exit 2; }
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
status=0
ctest --test-dir "$build" -L cuda --output-on-failure --output-junit gpu-junit.xml || status=$?
echo
echo "== GPU check summary =="
grep -o 'tests="[0-9]*" failures="[0-9]*" disabled="[0-9]*" skipped="[0-9]*"' "$build/gpu-junit.xml" 2>/dev/null || true
exit $status
