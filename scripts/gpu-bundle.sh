#!/usr/bin/env bash
# Builds the GPU check bundle: the CUDA test binaries and the decode benchmark, stripped, plus
# scripts/gpu-check.sh, in target/gpu-bundle/ (git-ignored under target/; a few MB, far below
# the 64 MiB a device run may carry). The bundle runs on a machine with an NVIDIA GPU, its
# driver and the CUDA 12 libraries (cuBLAS, NVRTC) but no Rust toolchain:
#
#   scripts/gpu-bundle.sh                 # here, where cargo is
#   target/gpu-bundle/gpu-check.sh        # there (or: scripts/gpu-check.sh target/gpu-bundle)
#
# Needs no GPU and no CUDA toolkit to build (cudarc loads the CUDA libraries at run time).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-target/gpu-bundle}"

artifacts() {
  # Prints "<bundle name> <executable>" for the binaries the check runs, from cargo's JSON.
  python3 -c '
import json, sys
wanted = {("lib", "engine_worker"): "engine_worker_unit", ("test", "cuda_nvrtc"): "cuda_nvrtc",
          ("test", "cuda_parity"): "cuda_parity", ("example", "cuda_bench"): "cuda_bench"}
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    for kind in msg["target"]["kind"]:
        name = wanted.get((kind, msg["target"]["name"]))
        if name:
            print(name, msg["executable"])
'
}

echo "gpu-bundle: building CUDA tests (dev profile, engine-worker at opt-level 3)"
tests="$(cargo test -p engine-worker --features cuda --no-run --message-format=json \
  --lib --test cuda_nvrtc --test cuda_parity | artifacts)"
echo "gpu-bundle: building the benchmark (release)"
bench="$(cargo build --release -p engine-worker --features cuda --example cuda_bench \
  --message-format=json | artifacts)"

rm -rf "$out"
mkdir -p "$out/bin"
while read -r name exe; do
  [ -n "$name" ] || continue
  strip -o "$out/bin/$name" "$exe"
done <<<"$tests
$bench"

for want in cuda_nvrtc cuda_parity engine_worker_unit cuda_bench; do
  [ -x "$out/bin/$want" ] || { echo "gpu-bundle: $want was not built" >&2; exit 1; }
done
cp scripts/gpu-check.sh "$out/gpu-check.sh"
chmod +x "$out/gpu-check.sh"
{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "rustc: $(rustc --version)"
} >"$out/MANIFEST"

size_kib="$(du -sk "$out" | cut -f1)"
if [ "$size_kib" -gt $((64 * 1024)) ]; then
  echo "gpu-bundle: $out is ${size_kib} KiB, above the 64 MiB limit" >&2
  exit 1
fi
echo "gpu-bundle: $out ready (${size_kib} KiB):"
ls -l "$out/bin"
