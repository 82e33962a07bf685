#!/usr/bin/env bash
# Serves the default model locally: builds release binaries, fetches SmolLM2-135M-Instruct,
# starts token-processor, engine-worker and api-server on loopback, waits until all three are
# ready, and stops all three cleanly on Ctrl-C / SIGTERM.
#
# Environment: SPECULA_API_PORT (8000), SPECULA_METRICS_PORT (9400),
# SPECULA_NUM_SPEC_TOKENS (4), SPECULA_SPEC_POLICY (goodput), SPECULA_PROPOSER (suffix),
# SPECULA_PREFIX_CACHING (true), SPECULA_DRAFT_MODEL (a draft GGUF sharing the model's
# vocabulary, instead of the proposer), SPECULA_DRAFT_LAYERS (N: the model's first N layers
# draft for it),
# SPECULA_MODEL (the fetched GGUF).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

export SPECULA_API_PORT="${SPECULA_API_PORT:-8000}"
export SPECULA_METRICS_PORT="${SPECULA_METRICS_PORT:-9400}"
export SPECULA_NUM_SPEC_TOKENS="${SPECULA_NUM_SPEC_TOKENS:-4}"
if [ -z "${SPECULA_MODEL:-}" ]; then
  scripts/fetch-model.sh
  export SPECULA_MODEL="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
export RUST_LOG="${RUST_LOG:-info}"

# Private ipc endpoints for this instance, so two stacks on one machine do not collide.
run_dir="$(mktemp -d "${TMPDIR:-/tmp}/specula.XXXXXX")"
export SPECULA_WORKER_API_ENDPOINT="ipc://$run_dir/worker-0.sock"
export SPECULA_WORKER_ENDPOINTS="$SPECULA_WORKER_API_ENDPOINT"
export SPECULA_INGEST_ENDPOINT="ipc://$run_dir/tp-ingest.sock"
export SPECULA_TP_API_ENDPOINT="ipc://$run_dir/tp-api.sock"

cargo build --release --bins -p engine-worker -p token-processor -p api-server
bin="$root/target/release"

pids=()
stop() {
  trap - INT TERM EXIT
  if [ ${#pids[@]} -gt 0 ]; then
    echo "serve: stopping (SIGTERM, draining)..." >&2
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  rm -rf "$run_dir"
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

"$bin/token-processor" & pids+=($!)
SPECULA_TP_ENDPOINT="$SPECULA_INGEST_ENDPOINT" "$bin/engine-worker" & pids+=($!)
SPECULA_TP_ENDPOINT="$SPECULA_TP_API_ENDPOINT" "$bin/api-server" & pids+=($!)

healthy() { python3 - "$1" <<'PY'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}
api="http://127.0.0.1:$SPECULA_API_PORT"
metrics="http://127.0.0.1:$SPECULA_METRICS_PORT"
deadline=$((SECONDS + 300))
until healthy "$api/health" && healthy "$metrics/health"; do
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "serve: a process exited during startup" >&2; exit 1; }
  done
  [ $SECONDS -lt $deadline ] || { echo "serve: not ready after 300 s" >&2; exit 1; }
  sleep 0.5
done

proposer="${SPECULA_PROPOSER:-suffix}"
[ -n "${SPECULA_DRAFT_LAYERS:-}" ] && proposer="layers:$SPECULA_DRAFT_LAYERS"
[ -n "${SPECULA_DRAFT_MODEL:-}" ] && proposer="draft model $SPECULA_DRAFT_MODEL"
cat <<MSG
specula is ready (K=$SPECULA_NUM_SPEC_TOKENS, drafting policy ${SPECULA_SPEC_POLICY:-goodput}, proposer $proposer).
  OpenAI API: $api/v1
  Metrics:    $metrics/metrics
Try:
  curl -s $api/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32}'
Ctrl-C stops all three.
MSG
wait -n "${pids[@]}" || true
echo "serve: a process exited; stopping the others" >&2
