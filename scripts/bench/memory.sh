#!/usr/bin/env bash
# Resident memory of the engine-worker around a burst, for each KV cache precision, backed as
# blocks are first written (the default) or at start (--kv-cache-prefault), on 4 KiB pages (the
# default) or huge pages, beside llama-server at the same token capacity (its default f16 cache, and q8_0): RSS at
# start, at the peak of a burst of N concurrent greedy completions of M tokens past EOS, and
# 2 s after it drained (scripts/bench/memory.py).
#
# Usage: scripts/bench/memory.sh                 Environment: N (64), MAX_TOKENS (128),
#   CONFIGS (space-separated DTYPE[:prefault|:huge] worker runs; default
#   "f32 f16 bf16 q8_0 f32:prefault f16:huge"),
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
configs="${CONFIGS:-f32 f16 bf16 q8_0 f32:prefault f16:huge}"
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

for config in $configs; do
  IFS=: read -r dtype mode <<<"$config"
  envs=(SPECULA_KV_CACHE_DTYPE="$dtype" SPECULA_KV_CACHE_PREFAULT=false SPECULA_KV_CACHE_HUGE_PAGES=false)
  case "${mode:-}" in
    "") ;;
    prefault) envs+=(SPECULA_KV_CACHE_PREFAULT=true) ;;
    huge) envs+=(SPECULA_KV_CACHE_HUGE_PAGES=true) ;;
    *) echo "memory.sh: unknown mode in '$config'" >&2; exit 2 ;;
  esac
  port="$(free_port)"
  run_dir="$(mktemp -d)"
  env "${envs[@]}" SPECULA_API_PORT="$port" SPECULA_METRICS_PORT="$(free_port)" \
    SPECULA_RUN_DIR="$run_dir" setsid scripts/serve.sh >"$run_dir/serve.log" 2>&1 &
  serve=$!
  wait_up "http://127.0.0.1:$port/health"
  python3 scripts/bench/memory.py --url "http://127.0.0.1:$port" --pid "$(cat "$run_dir/engine-worker.pid")" \
    --n "$n" --max-tokens "$max_tokens" --label "specula kv=$dtype${mode:+ $mode}" | tee -a "$out"
  kill -TERM -- "-$serve" 2>/dev/null || kill -TERM "$serve"
  wait "$serve" 2>/dev/null || true
done

if [ -x "$llama" ]; then
  # llama.cpp's cache is f16 by default; a quantized V cache needs flash attention.
  for kv in f16 q8_0; do
    flags=(-fa off)
    [ "$kv" = q8_0 ] && flags=(-fa on -ctk q8_0 -ctv q8_0)
    port="$(free_port)"
    setsid "$llama" -m "$model" -t 2 -c 32768 --parallel 16 "${flags[@]}" --host 127.0.0.1 \
      --port "$port" >/tmp/specula-memory-llama.log 2>&1 &
    pid=$!
    wait_up "http://127.0.0.1:$port/health"
    python3 scripts/bench/memory.py --url "http://127.0.0.1:$port" --pid "$pid" --n "$n" \
      --max-tokens "$max_tokens" --label "llama-server -c 32768 --parallel 16 kv=$kv" | tee -a "$out"
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
  done
fi
echo "memory.sh: results in $out" >&2
