#!/usr/bin/env bash
# Checks `token-processor replay --what-if` against measured runs: for each workload, serves it
# with the fixed policy at K = 4, 2 and 1 (scripts/bench/serving.sh, each stack recording its
# acceptance trace), re-scores the K = 4 trace at every K' and prints predicted against measured
# tokens/s (measured two ways: over the trace's own steps, as the prediction is, and as the
# client saw it).
#
# Usage: scripts/bench/whatif.sh [WORKLOADS]   (default "sharegpt grounded")
# Environment: OUT_DIR (default /tmp/specula-whatif), CONCURRENCY (4), NUM_PROMPTS (24),
#   KS (the measured K values, default "4 2 1"; the first is the one re-scored),
#   SERVING_ARGS (passed on, e.g. "--max-tokens 128").
# Run it on an otherwise idle machine, like serving.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
workloads="${1:-sharegpt grounded}"
out="${OUT_DIR:-/tmp/specula-whatif}"
concurrency="${CONCURRENCY:-4}"
num_prompts="${NUM_PROMPTS:-24}"
read -r -a ks <<<"${KS:-4 2 1}"
mkdir -p "$out"
cargo build --release -q -p token-processor
tp="$root/target/release/token-processor"

for w in $workloads; do
  for k in "${ks[@]}"; do
    trace="$out/trace-$w-k$k.jsonl"
    rm -f "$trace"
    SPECULA_TRACE_ACCEPTANCE="$trace" SPECULA_SETTINGS="k$k:$k:fixed" SKIP_LLAMA=1 \
      OUT_DIR="$out/$w-k$k" scripts/bench/serving.sh "$w" "$concurrency" "$num_prompts" \
      >"$out/$w-k$k.log" 2>&1
  done
  "$tp" replay --what-if "$out/trace-$w-k${ks[0]}.jsonl" --out "$out/report-$w" >"$out/report-$w.txt"
done

python3 scripts/bench/whatif_table.py "$out" "$workloads" "${ks[@]}"
