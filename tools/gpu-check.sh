#!/usr/bin/env bash
# The one GPU check (docs/gpu.md), in two halves, because the GPU machine may have no package archive, none of our
# dependencies, and only what travels to it (at most 64 MiB):
#
#   bash tools/gpu-check.sh bundle [DIR]   here, where nvcc is: build a portable bundle into DIR (out/gpu-bundle)
#   bash DIR/run.sh                        there, on the GPU machine: every GPU check, a summary table last
#
# The bundle is built in its own folder (build-gpu/, Release) with the CUDA runtime, libstdc++, libgcc, GoogleTest
# and RapidCheck linked statically, so its programs need nothing but the base system and the NVIDIA driver. This
# script checks that with ldd and checks the bundle's size.
#
# Exit: 0 bundle written and checked; 1 build failed; 2 bad usage; 4 the bundle needs a library outside the base
# system or is over 64 MiB (it is left in DIR for inspection).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() { echo "usage: bash tools/gpu-check.sh bundle [DIR]   (then run DIR/run.sh on the GPU machine)"; exit 2; }
[ "${1:-}" = "bundle" ] || usage
[ $# -le 2 ] || usage
dest=${2:-out/gpu-bundle}
build=build-gpu
jobs=${JOBS:-2}
limit_bytes=$((64 * 1024 * 1024))

command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu-check: no nvcc (the bundle is built where the CUDA toolkit is)"; exit 1; }
export PATH=$PATH:/usr/local/cuda/bin

static_link="-static-libstdc++ -static-libgcc"
mkdir -p "$build"
echo "== configure $build (Release, static CUDA runtime, static libstdc++/libgcc)"
cmake -S . -B "$build" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DKVCHECK_CUDA=ON -DKVCHECK_CUDA_STATIC_RUNTIME=ON \
      -DKVCHECK_BUILD_TESTS=ON -DKVCHECK_BUILD_BENCHMARKS=OFF \
      -DCMAKE_EXE_LINKER_FLAGS="$static_link" -DCMAKE_SHARED_LINKER_FLAGS="$static_link" \
      -DCMAKE_MODULE_LINKER_FLAGS="$static_link" > "$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; echo "gpu-check: configure failed"; exit 1; }

# The targets the bundle holds; the engine's plugin and the benchmark exist only once the CUDA engine is built.
targets=(kvcheck kvcheck_gpu_probe)
all_targets=$(cmake --build "$build" --target help 2>/dev/null)
have_target() { grep -qx "\.\.\. $1" <<< "$all_targets"; }
have_target kvcheck_gpu_probe || { echo "gpu-check: no target kvcheck_gpu_probe (optimized/bench/cuda not added?)"; exit 1; }
for t in kvcheck_cuda_engine_plugin kvcheck_bench_cuda; do
  if have_target "$t"; then targets+=("$t"); else echo "   (no target $t in this tree: the bundle goes without it)"; fi
done
echo "== build ${targets[*]} and every test under tests/cuda (-j$jobs)"
cmake --build "$build" --target "${targets[@]}" -j"$jobs"
make -C "$build/tests/cuda" -j"$jobs" --no-print-directory  # every program of that folder (Makefiles generator)

# The CUDA test programs: the executables of the tests labelled "cuda".
mapfile -t tests < <(ctest --test-dir "$build" -L cuda --show-only=json-v1 | python3 -c '
import json, os, sys
seen = []
for t in json.load(sys.stdin)["tests"]:
    exe = (t.get("command") or [""])[0]
    if exe and exe not in seen:
        seen.append(exe)
print("\n".join(seen))')
[ ${#tests[@]} -gt 0 ] || { echo "gpu-check: no test labelled cuda in $build"; exit 1; }

echo "== bundle into $dest"
# replaced whole: only an earlier bundle or an empty folder, never anything else a typo could name
if [ -e "$dest" ] && [ ! -f "$dest/BUNDLE.txt" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
  echo "gpu-check: $dest exists and is not a bundle; not overwriting it"; exit 2
fi
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/tools/gpu" "$dest/tools/python_example"
for t in "${targets[@]}"; do
  case $t in
    *_plugin) cp "$build/lib/lib$t.so" "$dest/lib/" ;;
    *) cp "$build/bin/$t" "$dest/bin/" ;;
  esac
done
for t in "${tests[@]}"; do cp "$t" "$dest/bin/"; basename "$t"; done > "$dest/tests.txt"
# The device-memory watch of NO-Q/MEMORY loads a CUDA runtime with dlopen (KVCHECK_CUDART); the GPU machine may
# have none on its library path, so the bundle brings NVIDIA's own (run.sh points KVCHECK_CUDART at it).
cudart=$(readlink -f /usr/local/cuda/lib64/libcudart.so.13 2>/dev/null || true)
[ -f "$cudart" ] && cp "$cudart" "$dest/lib/libcudart.so.13"
strip --strip-unneeded "$dest"/bin/* "$dest"/lib/libkvcheck*.so 2> /dev/null || true
cp tools/gpu/run.sh "$dest/run.sh"
cp tools/gpu/*.py tools/gpu/*.json "$dest/tools/gpu/"
cp tools/python_example/safetensors_np.py tools/python_example/vectors_io.py "$dest/tools/python_example/"
{
  echo "kvcheck GPU bundle"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (plus uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m), $(ldd --version | head -1)"
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "cuda code: $(grep -rho -- '--generate-code=[^ ]*' "$build"/optimized/CMakeFiles/*/flags.make 2>/dev/null | sort -u | tr '\n' ' ')"
  echo "needs: glibc >= $(objdump -T "$dest"/bin/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | cut -d_ -f2) (the build machine's)"
  echo "programs: $(cd "$dest/bin" && echo *)"
  echo "libraries: $(cd "$dest/lib" && echo *)"
} > "$dest/BUNDLE.txt"

echo "== check: nothing outside the base system is needed (ldd)"
allowed='^(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|/lib64/ld-linux-x86-64\.so\.2)$'
bad=0
for f in "$dest"/bin/* "$dest"/lib/*.so*; do
  needs=$(ldd "$f" | awk '{print $1}')
  extra=$(echo "$needs" | grep -Ev "$allowed" || true)
  if [ -n "$extra" ]; then echo "   $(basename "$f") needs: $(echo $extra)"; bad=1; fi
done
[ $bad = 0 ] && echo "   ok: only libc, libm, libdl, libpthread, librt and the loader (libcuda comes from the driver at run time)"
glibc=$(objdump -T "$dest"/bin/* "$dest"/lib/*.so* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
echo "   newest glibc symbol version needed: ${glibc:-none}"

echo "== check: size"
bytes=$(du -sb "$dest" | cut -f1)
tree=$( (git ls-files -z | xargs -0 stat -c %s 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
printf '   bundle %s bytes (%.1f MiB), limit 64 MiB; with the tracked tree (%.1f MiB) %.1f MiB travel\n' \
  "$bytes" "$(echo "$bytes / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" \
  "$(echo "($bytes + $tree) / 1048576" | bc -l)"
[ "$bytes" -le $limit_bytes ] || { echo "gpu-check: the bundle is over 64 MiB"; bad=1; }
echo "   bundle size: $bytes bytes" >> "$dest/BUNDLE.txt"

[ $bad = 0 ] || exit 4
echo "gpu-check: bundle ready in $dest; on the GPU machine: bash $dest/run.sh  (docs/gpu.md)"
