#!/usr/bin/env bash
# Serves the default model locally: builds release binaries, fetches SmolLM2-135M-Instruct,
# starts token-processor, engine-worker and api-server on loopback and waits until all three are
# ready. As the systemd units do (Restart=always, RestartSec=1), a process that exits on its own
# is started again after 1 s while the others go on; Ctrl-C / SIGTERM stops all three cleanly.
#
# Environment: SPECULA_API_PORT (8000), SPECULA_METRICS_PORT (9400),
# SPECULA_NUM_SPEC_TOKENS (4), SPECULA_SPEC_POLICY (goodput), SPECULA_PROPOSER (suffix),
# SPECULA_PREFIX_CACHING (true), SPECULA_DRAFT_MODEL (a draft GGUF sharing the model's
# vocabulary, instead of the proposer), SPECULA_DRAFT_LAYERS (N: the model's first N layers
# draft for it), SPECULA_DRAFT_HEAD (an EAGLE-3 head directory, docs/draft-heads.md),
# SPECULA_MODEL (the fetched GGUF), SPECULA_BIN_DIR (prebuilt binaries: skips the build),
# SPECULA_RUN_DIR (the ipc endpoints' directory, where each process's pid is kept as
# NAME.pid; a fresh one by default).
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
run_dir="${SPECULA_RUN_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/specula.XXXXXX")}"
mkdir -p "$run_dir"
export SPECULA_WORKER_API_ENDPOINT="ipc://$run_dir/worker-0.sock"
export SPECULA_WORKER_ENDPOINTS="$SPECULA_WORKER_API_ENDPOINT"
export SPECULA_INGEST_ENDPOINT="ipc://$run_dir/tp-ingest.sock"
export SPECULA_TP_API_ENDPOINT="ipc://$run_dir/tp-api.sock"

if [ -n "${SPECULA_BIN_DIR:-}" ]; then
  bin="$SPECULA_BIN_DIR"
else
  cargo build --release --bins -p engine-worker -p token-processor -p api-server
  bin="$root/target/release"
fi

# Runs NAME's command again 1 s after it exits on its own; on SIGTERM stops it and returns.
supervise() {  # NAME COMMAND...
  local name="$1" child="" code
  shift
  trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 0' TERM
  trap '' INT  # Ctrl-C reaches the script, which stops everyone with SIGTERM
  while :; do
    "$@" &
    child=$!
    echo "$child" >"$run_dir/$name.pid"
    code=0
    wait "$child" || code=$?
    echo "serve: $name exited (status $code); restarting it in 1 s" >&2
    sleep 1
  done
}

supervisors=()
stop() {
  trap - INT TERM EXIT
  if [ ${#supervisors[@]} -gt 0 ]; then
    echo "serve: stopping (SIGTERM, draining)..." >&2
    # The units' order: the api-server first (it refuses new work and lets its streams
    # finish), then the worker, then the token-processor, which carries their last tokens.
    local i
    for i in 2 1 0; do
      kill -TERM "${supervisors[$i]}" 2>/dev/null || true
      wait "${supervisors[$i]}" 2>/dev/null || true
    done
  fi
  [ -n "${SPECULA_RUN_DIR:-}" ] || rm -rf "$run_dir"
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

supervise token-processor "$bin/token-processor" & supervisors+=($!)
supervise engine-worker env SPECULA_TP_ENDPOINT="$SPECULA_INGEST_ENDPOINT" "$bin/engine-worker" &
supervisors+=($!)
supervise api-server env SPECULA_TP_ENDPOINT="$SPECULA_TP_API_ENDPOINT" "$bin/api-server" &
supervisors+=($!)

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
  [ $SECONDS -lt $deadline ] || { echo "serve: not ready after 300 s" >&2; exit 1; }
  sleep 0.5
done

proposer="${SPECULA_PROPOSER:-suffix}"
[ -n "${SPECULA_DRAFT_LAYERS:-}" ] && proposer="layers:$SPECULA_DRAFT_LAYERS"
[ -n "${SPECULA_DRAFT_MODEL:-}" ] && proposer="draft model $SPECULA_DRAFT_MODEL"
[ -n "${SPECULA_DRAFT_HEAD:-}" ] && proposer="draft head $SPECULA_DRAFT_HEAD"
cat <<MSG
specula is ready (K=$SPECULA_NUM_SPEC_TOKENS, drafting policy ${SPECULA_SPEC_POLICY:-goodput}, proposer $proposer).
  OpenAI API: $api/v1
  Metrics:    $metrics/metrics
Try:
  curl -s $api/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32}'
A process that exits is restarted after 1 s; Ctrl-C stops all three.
MSG
# The supervisors return only when stopped.
wait "${supervisors[@]}" || true
