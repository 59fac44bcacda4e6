#!/usr/bin/env bash
# Configures and builds kvcheck (Release) into build/. Idempotent: a second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
echo "[build] cmake -S . -B build (Release), $jobs jobs"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j "$jobs" >> build.log 2>&1 || { tail -n 60 build.log; echo "[build] FAILED (full log: build.log)"; exit 1; }
echo "[build] done: build/bin/kvcheck"
