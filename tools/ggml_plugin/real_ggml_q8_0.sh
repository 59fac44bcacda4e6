#!/usr/bin/env bash
# ctest real.ggml.q8_0: kvcheck judges llama.cpp's ggml q8_0 cache (tools/ggml_plugin), 50 cases per property.
#
#   real_ggml_q8_0.sh KVCHECK PLUGIN OUTDIR
#
# The plugin declares what ggml does (docs/real-implementations.md, "ggml q8_0"): q quantized to q8_0 before
# attention (pipeline.q = KVC_ROUND_Q8_0) and q8_0 codes rounded as ggml's kernel of the architecture does
# (KVC_PIPELINE_Q8_0_RECIP_AMAX_EVEN on x86, KVC_PIPELINE_Q8_0_RECIP_D_EVEN on ARM NEON). kvcheck applies both
# exactly, so the verdict asserted is CONFORMANT:
#  - kvcheck validate exits 0;
#  - no case is FAIL, ERROR, CRASH or TIMEOUT, and at least one case of each core property ran;
#  - the report reads the declared pipeline back: q = q8_0, with the x86 rounding on x86-64 (neon on aarch64).
# Writes OUTDIR/report.json. Exit 0 as recorded, 1 otherwise, 77 when the plugin or python3 is missing.
set -uo pipefail
kvcheck=$1 plugin=$2 out=$3
if [ ! -f "$plugin" ]; then
  echo "SKIP: $plugin is not built (bash tools/setup-ggml.sh, then reconfigure)"
  exit 77
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIP: python3 is needed to read kvcheck's report"
  exit 77
fi
mkdir -p "$out"
rm -rf "$out/counterexamples"
"$kvcheck" validate --plugin "$plugin" --cases 50 --seed 1 --report "$out/report.json" \
  --counterexamples "$out/counterexamples" | tail -n 16
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ] && [ "$rc" != 1 ]; then
  echo "FAIL: kvcheck validate exited $rc (0 or 1 expected: the plugin must load and run)"
  exit 1
fi
case "$(uname -m)" in
  x86_64|i?86) rounding=x86 ;;
  aarch64|arm64) rounding=neon ;;
  *) rounding=ref ;;
esac
python3 - "$out/report.json" "$rc" "$rounding" <<'PY'
import json, sys
impl = json.load(open(sys.argv[1]))["implementations"][0]
rc, rounding = int(sys.argv[2]), sys.argv[3]
problems, ran, counts = [], {}, {}
for case in impl["cases"]:
    p, v, why = case["property"], case["verdict"], case.get("reason") or ""
    counts[v] = counts.get(v, 0) + 1
    if v != "NOT_SUPPORTED":
        ran[p] = True
    if v in ("FAIL", "ERROR", "CRASH", "TIMEOUT"):
        problems.append(f"{case['id']} {v}: {why}")
for p in ("EQUIV", "CACHE-CONTENT", "APPEND-ONLY", "NO-Q", "MEMORY", "GQA", "FORK", "RELEASE", "LONG"):
    if not ran.get(p):
        problems.append(f"{p}: no q8_0 case ran")
pipe = impl["capabilities"]["pipeline"]
got_rounding = pipe.get("q8_0_rounding", "ref")
if pipe["q"] != "q8_0":
    problems.append(f"pipeline q read as {pipe['q']}, not the declared q8_0")
if got_rounding != rounding:
    problems.append(f"q8_0 rounding read as {got_rounding}, {rounding} expected on this architecture")
if rc != 0:
    problems.append(f"kvcheck validate exited {rc}: not CONFORMANT")
print(f"verdicts: {counts}; pipeline q = {pipe['q']}, q8_0 rounding = {got_rounding}")
if problems:
    print("FAIL:\n  " + "\n  ".join(problems[:20]))
    sys.exit(1)
print("CONFORMANT, as docs/real-implementations.md records")
PY
