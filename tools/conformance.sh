#!/usr/bin/env bash
# README command 1, the main job: install what is missing, build (Release), then
#   1. check that the reference reproduces every number of the source documents (golden/), and
#   2. run the conformance properties against every built-in implementation and print the verdict table, and
#   3. run the model-level properties (docs/model-level.md) against our model engine and the C example.
# Reports land in out/: conformance.json (canonical; operation level), conformance.xml (JUnit), and
# conformance-model-engine.{json,xml}, conformance-model-example.{json,xml} (model level; "level" on every property),
# counterexamples/ (replayable). A built-in that cannot run here (the CUDA engine without a device) is skipped with
# the reason.
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
for engine in engine example; do
  echo
  echo "[conformance] build/bin/kvcheck validate --plugin build/lib/libkvcheck_model_${engine}_plugin.so --level model"
  build/bin/kvcheck validate --plugin "build/lib/libkvcheck_model_${engine}_plugin.so" --level model --cases 100 \
    --seed 20261129 --report "out/conformance-model-${engine}.json" --junit "out/conformance-model-${engine}.xml" \
    --counterexamples "out/counterexamples/model-${engine}" \
    || { rc=$?; [ $status -eq 0 ] && status=$rc; }
done
echo
echo "[conformance] reports: out/conformance.json, out/conformance.xml (operation level);"
echo "              out/conformance-model-engine.json, out/conformance-model-example.json (+ .xml; model level)"
exit $status
