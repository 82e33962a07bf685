#!/usr/bin/env bash
# token-processor benchmarks (results go in docs/history/benchmarks-notebook.md, section "token-processor"):
#  1. tp-bench: a real token-processor over ipc, synthetic batches (64/256/512 rows, K=4/8),
#     sustained batches/s, request-steps/s, per-batch processing time; RSS over 1M requests.
#  2. The FastDeploy-style Python reference on the same batches (tp-bench --dump-dir).
# Usage: scripts/bench/run.sh [tp-bench options, e.g. --pin]   (criterion: cargo bench -p token-processor)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

cargo build --release -p token-processor --bins
dump="$(mktemp -d)"
trap 'rm -rf "$dump"' EXIT
target/release/tp-bench --dump-dir "$dump" "$@"
echo

# prometheus_client (what FastDeploy uses) in a local venv; the reference falls back to
# stand-ins if it cannot be installed.
venv="$root/target/bench-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q prometheus_client || true
fi
"$venv/bin/python" scripts/bench/fd_reference.py "$dump"
