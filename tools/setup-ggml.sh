#!/usr/bin/env bash
# Fetches and builds the ggml that the real q8_0 client (tools/ggml_plugin) is judged on: the copy vendored in the
# llama-cpp-python 0.3.36 sdist from PyPI, checksum-pinned, CPU backend only, static, no BLAS/CUDA/Metal/OpenMP.
# GGML_NATIVE=OFF builds ggml's portable x86-64 baseline (SSE4.2, AVX, AVX2, FMA, F16C, BMI2), not whatever this
# machine has: the same source gives the same kernels, and so the same stored codes, on every x86-64-v3 machine.
# Idempotent: an install whose stamp names the pinned sdist is left alone.
#
#   bash tools/setup-ggml.sh [DIR]        (default: build/ggml; KVCHECK_GGML_JOBS=N parallel jobs, default 1)
#
# DIR/install holds the headers, static libraries and CMake package (what tools/ggml_plugin links), DIR/VERSION says
# which ggml it is. Exit 0 ready; 77 PyPI could not be reached (the caller skips and says so: nothing was tested);
# 1 anything else (a wrong checksum, a build that fails: a real failure).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-build/ggml}
jobs=${KVCHECK_GGML_JOBS:-1}
# The version docs/real-implementations.md reports on. A newer sdist vendors a newer ggml: change both together.
pkg=llama-cpp-python
ver=0.3.36
sdist=llama_cpp_python-$ver.tar.gz
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
stamp="$dir/install/.kvcheck-stamp"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sha" ] && [ -f "$dir/install/include/ggml.h" ]; then
  echo "[ggml] $dir ready ($(head -n 1 "$dir/VERSION"))"
  exit 0
fi
mkdir -p "$dir/download"

have_sdist() { [ -f "$dir/download/$sdist" ] && echo "$sha  $dir/download/$sdist" | sha256sum -c --status; }

if ! have_sdist; then
  py=""
  for p in ${KVCHECK_GGML_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -m pip --version >/dev/null 2>&1; then py=$p; break; fi
  done
  if [ -z "$py" ]; then
    echo "[ggml] no python3 with pip here to fetch $sdist (Debian: apt-get install python3-pip)" >&2
    exit 1
  fi
  echo "[ggml] pip download $pkg==$ver (sdist)"
  log="$dir/download/pip-download.log"
  rm -f "$dir/download/$sdist"
  if ! "$py" -m pip download --disable-pip-version-check --no-input --timeout 30 --retries 2 --no-deps \
       --no-binary :all: -d "$dir/download" "$pkg==$ver" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    # Unreachable registry (no network, DNS, proxy) versus a real failure: only the first is a reason to skip.
    if grep -Eq "NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|ConnectTimeout|ProxyError|Network is unreachable|Could not fetch URL" "$log"; then
      echo "[ggml] PyPI cannot be reached from this machine; nothing was built" >&2
      exit 77
    fi
    echo "[ggml] pip download failed (see $log)" >&2
    exit 1
  fi
  if ! have_sdist; then
    echo "[ggml] $sdist does not have the pinned sha256 $sha: refusing to build it" >&2
    exit 1
  fi
fi

echo "[ggml] extracting vendor/llama.cpp/ggml from $sdist"
rm -rf "$dir/src" "$dir/build" "$dir/install"
mkdir -p "$dir/src"
top=llama_cpp_python-$ver
tar -xzf "$dir/download/$sdist" -C "$dir/src" --strip-components=3 "$top/vendor/llama.cpp/ggml" "$top/vendor/llama.cpp/LICENSE"
tar -xzf "$dir/download/$sdist" -C "$dir/src" --strip-components=1 "$top/CHANGELOG.md"
# A standalone ggml configures a pkg-config file from ggml.pc.in, which the sdist leaves out; nothing here reads it.
printf 'Name: ggml\nDescription: ggml\nVersion: @GGML_VERSION@\nLibs: -L@CMAKE_INSTALL_FULL_LIBDIR@ -lggml\n' \
  >"$dir/src/ggml/ggml.pc.in"

# The sdist carries no git metadata: the llama.cpp commit is the one its changelog names for this release.
ggml_ver=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))$/\2/p' "$dir/src/ggml/CMakeLists.txt" | paste -sd.)
commit=$(awk -v v="## [$ver]" '$0 == v {f = 1; next} f && /^## / {exit} f' "$dir/src/CHANGELOG.md" |
  sed -n 's/.*ggml-org\/llama\.cpp@\([0-9a-f]*\).*/\1/p' | head -n 1)
{
  echo "ggml $ggml_ver from llama.cpp ${commit:-unknown} (vendored in $pkg $ver, sha256 $sha)"
  echo "cmake: -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BLAS=OFF, CPU backend only, static"
} >"$dir/VERSION"

echo "[ggml] building $(head -n 1 "$dir/VERSION") with $jobs job(s)"
log="$dir/build.log"
if ! { cmake -S "$dir/src/ggml" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$(pwd)/$dir/install" \
         -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
         -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_CCACHE=OFF \
         -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGIT_EXE=GIT_EXE-NOTFOUND &&
       cmake --build "$dir/build" -j "$jobs" &&
       cmake --install "$dir/build"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "[ggml] build failed (see $log)" >&2
  exit 1
fi
echo "$sha" >"$stamp"
echo "[ggml] $dir ready ($(head -n 1 "$dir/VERSION"))"
