#!/usr/bin/env bash
# Installs the Debian packages kvcheck builds with, if any is missing. Idempotent; says what it does.
set -euo pipefail

# clang and libclang-rt-14-dev (it holds libclang_rt.fuzzer, which Debian 12's clang only recommends): the fuzzing
# stage of tools/test.sh and tools/fuzz.sh build the libFuzzer targets with them.
packages=(cmake make g++ libeigen3-dev librapidcheck-dev nlohmann-json3-dev libcli11-dev libgtest-dev
          libbenchmark-dev python3 python3-numpy python3-pytest clang libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[setup] all ${#packages[@]} Debian packages present"
  exit 0
fi
echo "[setup] installing from Debian's archive: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
