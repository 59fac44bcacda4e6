#!/usr/bin/env bash
# README command 1, the main job: install what is missing, build (Release), then
#   1. check that the reference reproduces every number of the source documents (golden/), and
#   2. run the conformance properties against every built-in implementation and print the verdict table.
# Reports land in out/: conformance.json (canonical), conformance.xml (JUnit), counterexamples/ (replayable). A
# built-in that cannot run here (the CUDA engine without a device) is skipped with the reason.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh || exit $?
mkdir -p out
status=0
echo "[conformance] build/bin/kvcheck golden verify"
build/bin/kvcheck golden verify || status=$?
echo
echo "[conformance] build/bin/kvcheck validate --builtin all (seed 20261129, 100 cases per property)"
build/bin/kvcheck validate --builtin all --cases 100 --seed 20261129 \
  --report out/conformance.json --junit out/conformance.xml --counterexamples out/counterexamples \
  || { rc=$?; [ $status -eq 0 ] && status=$rc; }
echo
echo "[conformance] reports: out/conformance.json, out/conformance.xml"
exit $status
