#!/usr/bin/env bash
# The GPU half of the one GPU check (docs/gpu.md). `bash tools/gpu-check.sh bundle` copies this file into the
# bundle as run.sh; run it there, on the GPU machine: `bash run.sh`. It needs only the bundle, bash, coreutils and
# the NVIDIA driver; python3 (with torch, for the PyTorch comparison) is used when present.
#
# In order, each step with its own time cap so that the whole run stays under 8 minutes (KVCHECK_GPU_BUDGET_S):
#   1. every CUDA test program (GoogleTest XML), the CPU-vs-CUDA output comparison among them (windowed, evicting
#      and MLA-shaped caches too: test_cuda_window_engine.cpp, part of test_cuda_engine)
#   2. kvcheck_bench_cuda (the benchmark goals, docs/gpu.md)
#   3. tools/gpu/sdpa_bench.py: the same decode with PyTorch's scaled_dot_product_attention, when torch imports
#   4. tools/gpu/sdpa_vectors.py: PyTorch SDPA over a cache held in torch tensors, graded by kvcheck (f16, bf16)
#   5. kvcheck validate --builtin cuda, every property, KVCHECK_GPU_CASES (200) cases each: NO-Q and MEMORY alone
#      (the device-memory watch reads the whole device's free memory, so nothing else may run beside them), then
#      the other properties in parallel shards; JSON and JUnit reports per shard. Last, because its time is the
#      least predictable (each case is a process of its own and pays for a CUDA context: about 0.2-0.34 s on an
#      H200 (docs/gpu.md), so 200 cases of every property need about 450 s): a cap cuts it, nothing else. The
#      harness draws windowed (windows, sinks, eviction) and latent (head_dim_v, RoPE range, MLA) cases because
#      the engine's caps declare them (docs/windowed-caches.md, "Generated cases"); nothing here asks for them
#   then a summary table, LAST.
# Every output is written under the results folder (KVCHECK_GPU_RESULTS, default ./results next to this file);
# when $OUT is set (the GPU machine's return folder) the summary, the benchmark JSON and a tarball of everything
# are copied there as well, at most 8 files.
#
# Exit codes:
#   0   every step ran and passed (benchmark goals are reported, not enforced)
#   1   a step failed: a CUDA test, validate not conformant, a benchmark or driver error, a step out of time
#   2   the bundle is incomplete (a program is missing): build it again with tools/gpu-check.sh bundle
#   3   nothing failed, but some step did not run (absent from the bundle, torch missing): nothing is claimed for it
#   77  no usable CUDA device: every GPU step printed "skipped: <the CUDA error>"; nothing was judged
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
budget=${KVCHECK_GPU_BUDGET_S:-460}
cases=${KVCHECK_GPU_CASES:-200}
res=${KVCHECK_GPU_RESULTS:-$here/results}
rm -rf "$res" && mkdir -p "$res" || { echo "run.sh: cannot write $res"; exit 2; }
bin=$here/bin
jobs=$(nproc 2> /dev/null || echo 4)
[ "$jobs" -gt 12 ] && jobs=12

names=() states=() details=()
record() { # step, PASS|FAIL|SKIPPED|NOT RUN|TIMEOUT, detail
  names+=("$1") states+=("$2") details+=("$3")
  printf '   -> %s: %s%s\n' "$1" "$2" "${3:+ ($3)}"
}
left() { echo $((budget - ($(date +%s) - start))); }
# a step's cap in seconds: its own, or what is left of the budget (at least 1: `timeout 0` would mean no limit)
cap() { local l; l=$(left); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
py() { command -v python3 > /dev/null && python3 "$@"; }

echo "== kvcheck GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), on $(hostname 2> /dev/null || echo '?') ($(nproc) cores)"
cat "$here/BUNDLE.txt" 2> /dev/null | sed 's/^/   /'
echo "   this machine: $(ldd --version 2> /dev/null | head -1)"
for f in bin/kvcheck bin/kvcheck_gpu_probe tests.txt; do
  [ -e "$here/$f" ] || { echo "run.sh: the bundle lacks $f (build it again: bash tools/gpu-check.sh bundle)"; exit 2; }
done

# The device-memory watch of NO-Q/MEMORY loads a CUDA runtime with dlopen: the bundle's own.
[ -f "$here/lib/libcudart.so.13" ] && export KVCHECK_CUDART="$here/lib/libcudart.so.13"
# cuBLAS (the prefill baseline) is loaded with dlopen: the toolkit's, or the one PyTorch brings.
if ! ldconfig -p 2> /dev/null | grep -q 'libcublas\.so\.13'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(py -c 'import nvidia.cublas as m; print(list(m.__path__)[0] + "/lib")' 2> /dev/null); do
    [ -e "$d/libcublas.so.13" ] && { export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; }
  done
fi

if command -v nvidia-smi > /dev/null; then
  nvidia-smi > "$res/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,temperature.gpu,power.draw \
             --format=csv > "$res/gpu-before.csv" 2>&1
  sed 's/^/   /' "$res/gpu-before.csv"
else
  echo "   (no nvidia-smi on this machine)"
fi

# Is there a device at all? The probe's answer is the reason every GPU step gives when it skips.
probe_t0=$(date +%s%N)
probe=$("$bin/kvcheck_gpu_probe" 2>&1); probe_rc=$?
# What one process pays to reach the device (mostly its CUDA context): every exec-isolated validate case pays it.
probe="$probe
the probe's whole process took $((($(date +%s%N) - probe_t0) / 1000000)) ms"
echo "$probe" > "$res/probe.txt"
echo "$probe" | sed 's/^/   /'
mapfile -t tests < "$here/tests.txt"

if [ "$probe_rc" -ne 0 ]; then
  reason=$(echo "$probe" | head -1)
  # Without a device nothing is judged; the programs are still started, to show that the bundle runs here.
  for t in "${tests[@]}"; do
    if "$bin/$t" --gtest_list_tests > "$res/list-$t.txt" 2>&1; then
      starts="the program starts here and lists $(grep -c '^  ' "$res/list-$t.txt") tests"
    else
      starts="the program does not even start here: $(tail -1 "$res/list-$t.txt")"
    fi
    echo "== CUDA tests: $t"; echo "skipped: $reason"; record "tests $t" SKIPPED "$reason; $starts"
  done
  echo "== kvcheck_bench_cuda"; echo "skipped: $reason"; record "bench" SKIPPED "$reason"
  echo "== PyTorch SDPA decode"; echo "skipped: $reason"; record "sdpa bench" SKIPPED "$reason"
  echo "== kvcheck validate --builtin cuda"; echo "skipped: $reason"; record "validate cuda" SKIPPED "$reason"
  echo "== PyTorch SDPA graded (vectors)"; echo "skipped: $reason"; record "sdpa vectors" SKIPPED "$reason"
  final=77
else
  final=0
  # 1. the CUDA test programs
  for t in "${tests[@]}"; do
    echo "== CUDA tests: $t"
    c=$(cap 120)
    if [ "$c" -le 5 ]; then record "tests $t" TIMEOUT "no time left in the ${budget}s budget"; continue; fi
    # Tests of the no-device path (named *UnavailableDevice*) can only skip where a device is usable: they are left
    # out here, and the detail says so (they run, and pass, on every machine without a GPU: CI's).
    excluded=$("$bin/$t" --gtest_list_tests --gtest_filter='*UnavailableDevice*' 2> /dev/null | grep -c '^  ')
    timeout "$c" "$bin/$t" --gtest_filter='-*UnavailableDevice*' --gtest_output="xml:$res/gtest-$t.xml" \
      > "$res/gtest-$t.log" 2>&1; rc=$?
    tail -3 "$res/gtest-$t.log" | sed 's/^/   /'
    counts=$(py - "$res/gtest-$t.xml" << 'EOF' 2> /dev/null
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
cases = r.iter("testcase")
n = f = s = 0
for c in cases:
    n += 1
    f += c.find("failure") is not None or c.find("error") is not None
    s += c.find("skipped") is not None
print(n, f, s)
EOF
)
    read -r n_run n_failed n_skipped <<< "${counts:-? ? ?}"
    counts="$n_run tests, $n_failed failed, $n_skipped skipped"
    [ "${excluded:-0}" -gt 0 ] && counts="$counts; $excluded no-device test(s) left out"
    [ "$n_run" = "?" ] && counts="no XML report read"
    if [ "$rc" = 124 ]; then record "tests $t" TIMEOUT "over ${c}s; $counts"
    elif [ "$rc" != 0 ]; then record "tests $t" FAIL "exit $rc; $counts"
    elif [ "$n_skipped" != 0 ]; then record "tests $t" "NOT RUN" "$counts: a skipped test is not a passed one"
    else record "tests $t" PASS "$counts"; fi
  done

  # 2. the benchmark goals
  echo "== kvcheck_bench_cuda"
  if [ -x "$bin/kvcheck_bench_cuda" ]; then
    c=$(cap 100)
    # shellcheck disable=SC2086 # KVCHECK_GPU_BENCH_ARGS: extra options, split on spaces (e.g. "--quick")
    timeout "$c" "$bin/kvcheck_bench_cuda" --json "$res/bench.json" ${KVCHECK_GPU_BENCH_ARGS:-} 2>&1 | tee "$res/bench.log"
    brc=${PIPESTATUS[0]}
    command -v nvidia-smi > /dev/null &&
      nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$res/gpu-after.csv" 2>&1
    case $brc in
      0) record "bench" PASS "$(grep -cE ' (met|missed) ' "$res/bench.log") goals measured: $(grep -c ' met ' "$res/bench.log") met" ;;
      124) record "bench" TIMEOUT "over ${c}s" ;;
      *) record "bench" FAIL "exit $brc: $(grep -m1 -E 'error|n/a' "$res/bench.log")" ;;
    esac
  else
    record "bench" "NOT RUN" "kvcheck_bench_cuda is not in the bundle (built without the CUDA engine)"
  fi

  # 3. PyTorch's decode on the same shapes
  torch_why=$(py -c 'import torch; assert torch.cuda.is_available(), "torch.cuda.is_available() is False"' 2>&1 | tail -1)
  command -v python3 > /dev/null || torch_why="no python3"
  echo "== PyTorch SDPA decode"
  if [ -z "$torch_why" ]; then
    c=$(cap 60)
    timeout "$c" python3 "$here/tools/gpu/sdpa_bench.py" --json "$res/sdpa.json" --ours "$res/bench.json" 2>&1 | tee "$res/sdpa.log"
    src=${PIPESTATUS[0]}
    [ "$src" = 0 ] && record "sdpa bench" PASS "$(grep -m1 'ours / SDPA' "$res/sdpa.log" || echo 'figures in sdpa.json')" \
                   || record "sdpa bench" FAIL "exit $src"
  else
    echo "skipped: torch: $torch_why"; record "sdpa bench" "NOT RUN" "torch: $torch_why"
  fi

  # 4. PyTorch SDPA graded through the vectors route
  echo "== PyTorch SDPA graded through the vectors route (f16, bf16)"
  if [ -z "$torch_why" ]; then
    c=$(cap 120)
    v=$res/sdpa-vectors
    ( set -e
      "$bin/kvcheck" export --caps "$here/tools/gpu/sdpa_caps.json" --out "$v/vectors" --cases 20 --dtypes f16,bf16 \
        --properties EQUIV,CACHE-CONTENT,APPEND-ONLY,MEMORY,GQA,BATCH,FORK,RELEASE > "$v.export.log" 2>&1
      timeout "$c" python3 "$here/tools/gpu/sdpa_vectors.py" --vectors "$v/vectors" --results "$v/results"
      "$bin/kvcheck" grade --vectors "$v/vectors" --results "$v/results" --report "$v/grade.json" \
        --junit "$v/grade.xml" > "$v.grade.log" 2>&1
    ) > "$v.log" 2>&1
    grc=$?
    tail -12 "$v.grade.log" 2> /dev/null | sed 's/^/   /'
    line=$(tail -1 "$v.grade.log" 2> /dev/null || tail -1 "$v.log")
    case $grc in
      0) record "sdpa vectors" PASS "$line" ;;
      *) record "sdpa vectors" FAIL "exit $grc: $line" ;;
    esac
    # the inputs come back from `kvcheck export` with the same options; the outputs are kept only when they failed
    rm -rf "$v/vectors"
    [ "$grc" = 0 ] && rm -rf "$v/results"
  else
    echo "skipped: torch: $torch_why"; record "sdpa vectors" "NOT RUN" "torch: $torch_why"
  fi

  # 5. the conformance properties on the CUDA engine, last: its time is the least predictable (every case is a
  #    process of its own, and each pays for a CUDA context), so a cap cuts it, not the other steps
  echo "== kvcheck validate --builtin cuda --profile full --cases $cases"
  mkdir -p "$res/validate"
  # Both parts are cut into shards, each with its own report, so that a cap loses one shard's report, not all.
  validate() { # shard name, filter, I/N, cases per process: one validate process, its reports named after the shard
    timeout "$(until_end)" "$bin/kvcheck" validate --builtin cuda --isolation exec --profile full --cases "$cases" \
      --filter "$2" --shard "$3" --cases-per-process "$4" --report "$res/validate/$1.json" \
      --junit "$res/validate/$1.xml" --counterexamples "$res/validate/counterexamples" > "$res/validate/$1.log" 2>&1
  }
  until_end() { local l=$((part_end - $(date +%s))); [ "$l" -lt 1 ] && l=1; echo "$l"; }
  vrc=0
  # NO-Q and MEMORY alone (the device-memory watch sees every process's allocations): 4 shards one after another,
  # in at most 2/5 of the time left; the other properties get the rest
  l=$(left); [ "$l" -lt 5 ] && l=5
  part_end=$(($(date +%s) + $(cap $((l * 2 / 5)))))
  for i in 0 1 2 3; do
    validate "noq-memory-$i" '^(NO-Q|MEMORY)/' "$i/4" 1; r=$?; [ "$r" -gt "$vrc" ] && vrc=$r
  done
  tail -3 "$res/validate/noq-memory-3.log" | sed 's/^/   /'
  # the other properties: 3 waves of $jobs shards in parallel, in batches of KVCHECK_GPU_CASES_PER_PROCESS (25) cases
  # per process (docs/cli.md, "Batches": every case that does not pass runs again alone). NO-Q and MEMORY above keep
  # one case per process: their device-memory watch has only been seen to work that way.
  per_process=${KVCHECK_GPU_CASES_PER_PROCESS:-25}
  part_end=$(($(date +%s) + $(cap "$(left)")))
  n=$((3 * jobs))
  for w in 0 1 2; do
    pids=()
    for j in $(seq 0 $((jobs - 1))); do
      i=$((w * jobs + j))
      validate "shard-$i" '^(?!NO-Q/|MEMORY/|NO-Q$|MEMORY$)' "$i/$n" "$per_process" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; r=$?; [ "$r" -gt "$vrc" ] && vrc=$r; done
  done
  verdicts=$(py - "$res/validate" "$cases" << 'EOF'
import glob, json, os, sys
total, props, missing = {}, {}, []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    rep = f[:-4] + ".json"
    if not os.path.exists(rep):
        missing.append(os.path.basename(rep))
        continue
    for impl in json.load(open(rep))["implementations"]:
        for p in impl["properties"]:
            c = props.setdefault(p["id"], {})
            for k, v in p["counts"].items():
                c[k] = c.get(k, 0) + v
                total[k] = total.get(k, 0) + v
with open(os.path.join(sys.argv[1], "summary.txt"), "w") as out:
    for pid, c in props.items():
        out.write(f"{pid:14} " + " ".join(f"{k}={v}" for k, v in sorted(c.items()) if v) + "\n")
    if missing:
        out.write("reports missing: " + ", ".join(missing) + "\n")
print(", ".join(f"{k} {v}" for k, v in sorted(total.items()) if v) + (f"; {len(missing)} report(s) missing" if missing else ""))
EOF
)
  cat "$res/validate/summary.txt" 2> /dev/null | sed 's/^/   /'
  [ -n "$verdicts" ] || verdicts="exit $vrc (reports not read: no python3?)"
  case $vrc in
    0) record "validate cuda" PASS "$verdicts" ;;
    124) record "validate cuda" TIMEOUT "a part ran over its cap; $verdicts" ;;
    *) record "validate cuda" FAIL "exit $vrc; $verdicts" ;;
  esac

  for s in "${states[@]}"; do
    case $s in
      FAIL | TIMEOUT) final=1 ;;
      "NOT RUN" | SKIPPED) [ "$final" = 0 ] && final=3 ;;
    esac
  done
fi

# The summary, last.
{
  echo
  echo "== GPU check summary ($(($(date +%s) - start)) s; results in $res)"
  printf '%-34s %-8s %s\n' step result detail
  for i in "${!names[@]}"; do printf '%-34s %-8s %s\n' "${names[$i]}" "${states[$i]}" "${details[$i]}"; done
  if [ -f "$res/bench.log" ]; then
    echo
    echo "benchmark ratios (kvcheck_bench_cuda):"
    sed -n '/^ratio /,$p' "$res/bench.log"
  fi
  echo
  case $final in
    0) echo "exit 0: every step ran and passed" ;;
    1) echo "exit 1: a step failed or ran out of time (see above)" ;;
    3) echo "exit 3: nothing failed, but some steps did not run (see above); nothing is claimed for them" ;;
    77) echo "exit 77: no usable CUDA device; every GPU step was skipped, nothing was judged" ;;
  esac
} > "$res/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  tar -czf "$OUT/gpu-results.tar.gz" -C "$(dirname "$res")" "$(basename "$res")" 2> /dev/null
  # a file over 16 MiB does not come back: then without the bulky replay files and driver outputs
  if [ "$(stat -c %s "$OUT/gpu-results.tar.gz")" -gt $((15 * 1048576)) ]; then
    r=$(basename "$res")
    tar -czf "$OUT/gpu-results.tar.gz" --exclude="$r/validate/counterexamples" --exclude="$r/sdpa-vectors/results" \
        -C "$(dirname "$res")" "$r" 2> /dev/null
  fi
  for f in summary.txt bench.json sdpa.json; do [ -f "$res/$f" ] && cp "$res/$f" "$OUT/"; done
fi
cat "$res/summary.txt"
exit $final
