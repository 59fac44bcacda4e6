#!/usr/bin/env bash
# README command 1: install what is missing, build (Release), run the conformance job on the built-in
# implementations and print the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
mkdir -p out
echo "[conformance] kvcheck golden verify"
build/bin/kvcheck golden verify
