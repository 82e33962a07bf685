#!/usr/bin/env bash
# Builds llama.cpp's llama-server (CPU, native) from the llama.cpp source vendored in PyPI's
# llama-cpp-python==0.3.36 sdist, for the serving benchmark (scripts/bench/serving.sh).
#
# Usage: scripts/bench/build-llama-server.sh [OUT_DIR]
#   OUT_DIR (or env LLAMA_TOOLS_DIR) defaults to <repo>/.tools/llama.cpp (git-ignored).
#   Env JOBS: parallel build jobs (default 2).
# Idempotent: does nothing when OUT_DIR/build/bin/llama-server already exists.
# Installs cmake and a C/C++ compiler with apt-get when missing. Prints the binary path last.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-${LLAMA_TOOLS_DIR:-$root/.tools/llama.cpp}}"
version=0.3.36
jobs="${JOBS:-2}"
bin="$out/build/bin/llama-server"

if [ -x "$bin" ]; then
  echo "build-llama-server: already built" >&2
  echo "$bin"
  exit 0
fi

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
if [ ${#need[@]} -gt 0 ]; then
  echo "build-llama-server: installing ${need[*]} with apt-get" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}" >&2
fi

mkdir -p "$out"
src="$out/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
  dl="$out/download"
  mkdir -p "$dl"
  if ! ls "$dl"/llama_cpp_python-$version.tar.gz >/dev/null 2>&1; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      --no-binary :all: "llama-cpp-python==$version" -d "$dl" >&2
  fi
  sdist="$(ls "$dl"/llama_cpp_python-$version.tar.gz)"
  unpack="$out/unpack"
  rm -rf "$unpack"
  mkdir -p "$unpack"
  tar -xzf "$sdist" -C "$unpack"
  vendor="$(find "$unpack" -maxdepth 4 -type d -path '*/vendor/llama.cpp' | head -n 1)"
  [ -n "$vendor" ] && [ -f "$vendor/CMakeLists.txt" ] || {
    echo "build-llama-server: no vendor/llama.cpp in $sdist" >&2
    exit 1
  }
  rm -rf "$src"
  mv "$vendor" "$src"
  rm -rf "$unpack"
fi

cd "$src"
cmake -B "$out/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$out/build" --target llama-server -j"$jobs" >&2
[ -x "$bin" ] || { echo "build-llama-server: $bin was not produced" >&2; exit 1; }
echo "build-llama-server: built" >&2
echo "$bin"
