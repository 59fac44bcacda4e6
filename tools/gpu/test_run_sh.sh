#!/usr/bin/env bash
# ctest gpu_check.run_sh_without_device: tools/gpu/run.sh, the GPU half of tools/gpu-check.sh, on a machine without
# a usable GPU, in a fake bundle around the real kvcheck_gpu_probe (argument 1). It must:
#   - exit 2 when the bundle lacks a program;
#   - print "skipped: <the probe's CUDA error>" for every GPU step, run none of them (the fake kvcheck and bench
#     leave a mark when called), start each test program with --gtest_list_tests only, put the summary last and
#     exit 77 (never 0).
# Where a device is usable this test has nothing to check and exits 77 (ctest: skipped).
set -uo pipefail
probe=${1:?usage: test_run_sh.sh PATH/TO/kvcheck_gpu_probe}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- run.sh output:"; cat "$work/out" 2> /dev/null; exit 1; }

if why=$("$probe"); then
  echo "skipped: a CUDA device is usable here ($why); this test covers machines without one"
  exit 77
fi
reason=$(echo "$why" | head -1)
[ -n "$reason" ] || fail "the probe exited non-zero without saying why"

b=$work/bundle
mkdir -p "$b/bin"
cp "$src/run.sh" "$b/run.sh"
bash "$b/run.sh" > "$work/out" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "an incomplete bundle gave exit $rc, not 2"

cp "$probe" "$b/bin/kvcheck_gpu_probe"
for p in kvcheck kvcheck_bench_cuda; do # a GPU step that ran anyway would leave its mark
  printf '#!/bin/sh\necho "$0 $*" >> "%s/called"\n' "$work" > "$b/bin/$p"
done
printf '#!/bin/sh\n[ "$1" = --gtest_list_tests ] || echo "$0 $*" >> "%s/called"\necho Suite.\necho "  One"\necho "  Two"\n' \
  "$work" > "$b/bin/test_fake_cuda"
chmod +x "$b"/bin/*
echo test_fake_cuda > "$b/tests.txt"
KVCHECK_GPU_RESULTS=$work/results OUT= bash "$b/run.sh" > "$work/out" 2>&1
rc=$?
[ "$rc" = 77 ] || fail "exit $rc without a device, not 77"
[ ! -e "$work/called" ] || fail "a GPU step ran without a device: $(cat "$work/called")"
n=$(grep -cxF "skipped: $reason" "$work/out")
[ "$n" -ge 5 ] || fail "$n GPU steps said 'skipped: $reason', expected 5 (tests, bench, sdpa bench, validate, sdpa vectors)"
grep -q "tests test_fake_cuda .*SKIPPED.*lists 2 tests" "$work/out" || fail "the test program's start was not reported"
[ "$(tail -1 "$work/out")" = "exit 77: no usable CUDA device; every GPU step was skipped, nothing was judged" ] ||
  fail "the summary is not last"
grep -q PASS "$work/out" && fail "something reads PASS without a device"
echo "ok: exit 2 for an incomplete bundle; without a device exit 77, $n steps skipped with '$reason'"
