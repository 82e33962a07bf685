#!/usr/bin/env bash
# The GPU check: runs the prebuilt CUDA tests and decode benchmark of a bundle made by
# scripts/gpu-bundle.sh, on a machine with an NVIDIA GPU, its driver and the CUDA 12 libraries
# (cuBLAS, NVRTC), no Rust needed, and prints a summary. Dummy weights only: no model file.
#
# Usage: gpu-check.sh [BUNDLE_DIR]   (default: the directory holding this script if it has
#        bin/, else target/gpu-bundle)
# Env:   GPU_CHECK_OUT   where logs and results go (default: $OUT if set, else ./gpu-check-results)
#        SPECULA_CUDA_DEVICE  device ordinal for the tests (default 0)
#        BENCH_ARGS      extra arguments for cuda_bench (e.g. "--steps 16")
#        TEST_TIMEOUT / BENCH_TIMEOUT  seconds (default 300 / 420)
# Exit status: 0 when every test passed and the benchmark ran.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ $# -ge 1 ]; then
  bundle="$(cd "$1" && pwd)"
elif [ -d "$here/bin" ]; then
  bundle="$here"
else
  bundle="$(cd "$here/.." && pwd)/target/gpu-bundle"
fi
results="${GPU_CHECK_OUT:-${OUT:-$bundle/results}}"
bin="$bundle/bin"
if [ ! -x "$bin/cuda_parity" ]; then
  echo "gpu-check: no bundle at $bundle (build it with scripts/gpu-bundle.sh)" >&2
  exit 2
fi
mkdir -p "$results"

declare -a summary=()
status=0
note() { summary+=("$1"); }

echo "== specula gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
cat "$bundle/MANIFEST" 2>/dev/null
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv \
    | tee "$results/gpu.csv"
  gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
else
  gpu="unknown (no nvidia-smi)"
fi
note "GPU: $gpu"

# Make the CUDA libraries findable when they are installed but not registered (CUDA toolkit
# directories, pip wheels such as nvidia-cublas-cu12 / nvidia-cuda-nvrtc-cu12).
have_lib() {
  ldconfig -p 2>/dev/null | grep -q "$1" && return 0
  local dir IFS=:
  for dir in ${LD_LIBRARY_PATH:-}; do
    [ -e "$dir/$1" ] && return 0
  done
  return 1
}
for lib in libnvrtc.so.12 libcublas.so.12 libcublasLt.so.12; do
  if ! have_lib "$lib"; then
    found="$(find /usr/local /usr/lib /opt "$HOME" -name "$lib" -not -path '*/proc/*' 2>/dev/null | head -1)"
    if [ -n "$found" ]; then
      export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "gpu-check: using $found"
    else
      echo "gpu-check: $lib not found; the tests will report it"
    fi
  fi
done

export SPECULA_REQUIRE_GPU=1
run_test() {
  local name="$1"; shift
  local log="$results/$name.log"
  echo "== $name"
  timeout "${TEST_TIMEOUT:-300}" "$bin/$name" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local line
  line="$(grep -E '^test result:' "$log" | tail -1)"
  if [ "$rc" -eq 0 ]; then
    note "PASS $name: ${line#test result: }"
  else
    note "FAIL $name (exit $rc): ${line:-no result line, see $log}"
    status=1
  fi
}
run_test cuda_nvrtc --test-threads=1
run_test cuda_parity --test-threads=1
run_test engine_worker_unit backend::cuda --test-threads=1

echo "== cuda_bench"
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-420}" "$bin/cuda_bench" ${BENCH_ARGS:-} >"$results/bench.jsonl" 2>"$results/bench.log"
rc=$?
cat "$results/bench.log" "$results/bench.jsonl"
if [ "$rc" -eq 0 ]; then
  note "PASS cuda_bench: $(wc -l <"$results/bench.jsonl") configurations (table in $results/bench.log)"
else
  note "FAIL cuda_bench (exit $rc), see $results/bench.log"
  status=1
fi

echo
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$results/summary.txt"
exit "$status"
