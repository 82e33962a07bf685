#!/usr/bin/env bash
# Resident memory of the engine-worker around a burst, with its KV cache backed as blocks are
# first written (the default) and backed at start (--kv-cache-prefault), beside llama-server at
# the same token capacity: RSS at start, at the peak of a burst of N concurrent greedy
# completions of M tokens past EOS, and 2 s after it drained (scripts/bench/memory.py).
#
# Usage: scripts/bench/memory.sh                 Environment: N (64), MAX_TOKENS (128),
#   SPECULA_BIN_DIR (prebuilt binaries; else serve.sh builds them), LLAMA_SERVER (default the
#   binary scripts/bench/build-llama-server.sh builds; skipped when absent), OUT (results, JSON
#   lines; default /tmp/specula-memory.jsonl).
# The worker's default cache is 2,048 blocks of 16 tokens (32,768 tokens); llama-server gets
# -c 32768 with 16 slots (the worker's --max-num-seqs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
n="${N:-64}"
max_tokens="${MAX_TOKENS:-128}"
out="${OUT:-/tmp/specula-memory.jsonl}"
llama="${LLAMA_SERVER:-$root/.tools/llama.cpp/build/bin/llama-server}"
scripts/fetch-model.sh >/dev/null
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
: >"$out"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() {  # URL
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "memory.sh: $1 never answered" >&2
  return 1
}

for prefault in false true; do
  port="$(free_port)"
  run_dir="$(mktemp -d)"
  SPECULA_API_PORT="$port" SPECULA_METRICS_PORT="$(free_port)" SPECULA_RUN_DIR="$run_dir" \
    SPECULA_KV_CACHE_PREFAULT="$prefault" setsid scripts/serve.sh >"$run_dir/serve.log" 2>&1 &
  serve=$!
  wait_up "http://127.0.0.1:$port/health"
  python3 scripts/bench/memory.py --url "http://127.0.0.1:$port" --pid "$(cat "$run_dir/engine-worker.pid")" \
    --n "$n" --max-tokens "$max_tokens" --label "specula prefault=$prefault" | tee -a "$out"
  kill -TERM -- "-$serve" 2>/dev/null || kill -TERM "$serve"
  wait "$serve" 2>/dev/null || true
done

if [ -x "$llama" ]; then
  port="$(free_port)"
  setsid "$llama" -m "$model" -t 2 -c 32768 --parallel 16 -fa off --host 127.0.0.1 --port "$port" \
    >/tmp/specula-memory-llama.log 2>&1 &
  pid=$!
  wait_up "http://127.0.0.1:$port/health"
  python3 scripts/bench/memory.py --url "http://127.0.0.1:$port" --pid "$pid" --n "$n" \
    --max-tokens "$max_tokens" --label "llama-server -c 32768 --parallel 16" | tee -a "$out"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
fi
echo "memory.sh: results in $out" >&2
