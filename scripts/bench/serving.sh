#!/usr/bin/env bash
# Serving benchmark, one workload at one concurrency, llama.cpp's llama-server against specula
# at several settings (scripts/bench/serving.py, in the method of vLLM's benchmark_serving).
#
# Usage: scripts/bench/serving.sh [WORKLOAD [CONCURRENCY [NUM_PROMPTS]]]
#   WORKLOAD     sharegpt | humaneval | grounded           (env WORKLOAD, default sharegpt)
#   CONCURRENCY  concurrent clients = llama-server slots   (env CONCURRENCY, default 4)
#   NUM_PROMPTS  prompts per server                        (env NUM_PROMPTS, default 40)
# Environment:
#   OUT_DIR            results (JSON per server, logs, summary.md); default /tmp/specula-bench
#   SPECULA_SETTINGS   space-separated name:num_spec_tokens:policy[:proposer], one specula
#                      stack each; default "k0:0:fixed k4fixed:4:fixed k4:4:goodput"
#                      (policy and proposer go to the worker as SPECULA_SPEC_POLICY and
#                      SPECULA_PROPOSER, e.g. "k4suffix:4:goodput:suffix"; a proposer
#                      draft=PATH is SPECULA_DRAFT_MODEL, layers=N is SPECULA_DRAFT_LAYERS,
#                      head=DIR is SPECULA_DRAFT_HEAD (an EAGLE-3 head), e.g.
#                      "q40:4:fixed:draft=/tmp/q4_0.gguf"); more fields kv=DTYPE and
#                      hugepages=BOOL set SPECULA_KV_CACHE_DTYPE and SPECULA_KV_CACHE_HUGE_PAGES
#                      (e.g. "f16:4:goodput:ngram:kv=f16"); set empty for none. Each stack's
#                      /metrics after its run lands beside its result (<tag>-NAME.metrics)
#   LLAMA_SERVER       llama-server binary; default <repo>/.tools/llama.cpp/build/bin/llama-server
#                      when it exists (scripts/bench/build-llama-server.sh builds it), else skipped
#   SKIP_LLAMA=1       do not run llama-server
#   LLAMA_SETTINGS     space-separated NAME[:draft=PATH] llama-server runs (default
#                      "llama-server"): draft=PATH adds --model-draft PATH --spec-type
#                      draft-simple --spec-draft-n-max 4 (llama.cpp's draft speculation, greedy),
#                      e.g. "llama-server llama-q40:draft=/tmp/q4_0.gguf"
#   MODEL              GGUF model; default models/SmolLM2-135M-Instruct.Q4_1.gguf (fetched)
#   THREADS            llama-server threads (default 2)
#   LLAMA_EXTRA_ARGS   more llama-server options; default "--no-repack" on a CPU that lists AMX
#                      (amx_int8 in /proc/cpuinfo), else none: ggml's AMX matmul
#                      (ggml_backend_amx_mul_mat) segfaults at start-up on such VMs
#                      (seen 2026-12-02), and --no-repack keeps weights out of the AMX buffer
#   SPECULA_START_TIMEOUT  seconds to wait for a specula stack, its release build included
#                      (default 3600)
#   ROUNDS             run every server this many times, in turn (default 1): results per round
#                      (<workload>-c<C>-n<N>-NAME-rR.json) and a table of medians, ratios paired by round, so
#                      that drift over minutes on a shared VM weighs less
# Run it on an otherwise idle machine: serving.py measures the CPU busy share for 1 s before
# each run, warns above 20 % and records it (cpu_busy_before) in the result; llama-server's
# spinning threads (-t = all cores) slow down many times over when a build shares the cores.
# Extra serving.py options can be given in SERVING_ARGS (e.g. "--max-tokens 64").
# Greedy texts of the specula settings are checked identical prompt by prompt (serving.py
# --compare) among the settings of one KV precision (another precision may legitimately
# change a near-tie); exit 1 when they differ or any request failed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

workload="${1:-${WORKLOAD:-sharegpt}}"
concurrency="${2:-${CONCURRENCY:-4}}"
num_prompts="${3:-${NUM_PROMPTS:-40}}"
out_dir="${OUT_DIR:-/tmp/specula-bench}"
settings="${SPECULA_SETTINGS-k0:0:fixed k4fixed:4:fixed k4:4:goodput}"  # set but empty: none
threads="${THREADS:-2}"
start_timeout="${SPECULA_START_TIMEOUT:-3600}"
rounds="${ROUNDS:-1}"
serving=(python3 "$root/scripts/bench/serving.py")
read -r -a extra <<<"${SERVING_ARGS:-}"

case "$workload" in sharegpt|humaneval|grounded) ;; *)
  echo "serving.sh: unknown workload $workload" >&2; exit 2 ;;
esac
[[ "$concurrency" =~ ^[1-9][0-9]*$ && "$num_prompts" =~ ^[1-9][0-9]*$ ]] || {
  echo "serving.sh: CONCURRENCY and NUM_PROMPTS must be positive integers" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "serving.sh: ROUNDS must be a positive integer" >&2; exit 2; }

if [ -z "${MODEL:-}" ]; then
  scripts/fetch-model.sh
  MODEL="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
[ -f "$MODEL" ] || { echo "serving.sh: no model at $MODEL" >&2; exit 2; }

llama="${LLAMA_SERVER:-}"
if [ -z "$llama" ] && [ -x "$root/.tools/llama.cpp/build/bin/llama-server" ]; then
  llama="$root/.tools/llama.cpp/build/bin/llama-server"
fi
[ "${SKIP_LLAMA:-0}" = 1 ] && llama=""
llama_settings="${LLAMA_SETTINGS:-llama-server}"
if [ -z "${LLAMA_EXTRA_ARGS+set}" ]; then
  LLAMA_EXTRA_ARGS=""
  grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && LLAMA_EXTRA_ARGS="--no-repack"
fi
read -r -a llama_extra <<<"$LLAMA_EXTRA_ARGS"

mkdir -p "$out_dir"
tag="$workload-c$concurrency-n$num_prompts"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
healthy() {
  python3 - "$1" <<'PY'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

# The server being run (one at a time): its pid, and whether it leads its own process group.
srv_pid=""
stop_server() {
  [ -n "$srv_pid" ] || return 0
  local pid="$srv_pid" i
  srv_pid=""
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 180; i++)); do          # up to 90 s to drain and exit
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "serving.sh: pid $pid did not exit after SIGTERM; killing its process group" >&2
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  else
    # Leftovers of the group (e.g. a cargo build serve.sh was still running).
    kill -TERM -- "-$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
client_pid=""
stop_all() {
  if [ -n "$client_pid" ]; then
    kill -TERM "$client_pid" 2>/dev/null || true
    wait "$client_pid" 2>/dev/null || true
    client_pid=""
  fi
  stop_server
}
trap 'stop_all' EXIT
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM

# wait_healthy URL TIMEOUT_S WHAT: until URL answers 200; fails if the server exits or times out.
wait_healthy() {
  local url="$1" deadline=$((SECONDS + $2)) what="$3"
  until healthy "$url"; do
    kill -0 "$srv_pid" 2>/dev/null || { echo "serving.sh: $what exited during startup" >&2; return 1; }
    [ $SECONDS -lt $deadline ] || { echo "serving.sh: $what not healthy after $2 s" >&2; return 1; }
    sleep 1
  done
}

status=0
names=()          # servers in order of first run, for the table
declare -A files  # NAME -> its result files, comma-separated, one per round
declare -A spec_files=()  # KV precision -> specula result files (all rounds) for --compare
first_spec=""
suffix=""         # "-rR" in round R when there are several

run_client() {  # NAME URL; the result lands in $out_dir/$tag-NAME$suffix.json
  local name="$1" url="$2" file="$out_dir/$tag-$1$suffix.json"
  echo "== $name: serving.py --workload $workload --concurrency $concurrency --num-prompts $num_prompts" >&2
  # In the background, so that a signal's trap runs at once (bash defers traps until a
  # foreground child exits).
  "${serving[@]}" --url "$url" --workload "$workload" --concurrency "$concurrency" \
    --num-prompts "$num_prompts" --label "$name" --out "$file" "${extra[@]}" &
  client_pid=$!
  local rc=0
  wait "$client_pid" || rc=$?
  client_pid=""
  if [ "$rc" != 0 ]; then
    echo "serving.sh: $name: serving.py failed (exit $rc)" >&2
    status=1
  fi
  if [ -f "$file" ]; then
    [ -n "${files[$name]+set}" ] || names+=("$name")
    files[$name]="${files[$name]:+${files[$name]},}$file"
  fi
  return 0
}

run_llama() {  # NAME [DRAFT]: one llama-server run
  local name="$1" draft="${2:-}"
  local draft_args=()
  [ -n "$draft" ] && draft_args=(--model-draft "$draft" --spec-type draft-simple --spec-draft-n-max 4)
  port="$(free_port)"
  log="$out_dir/$tag-$name$suffix.log"
  echo "== $name ($llama${LLAMA_EXTRA_ARGS:+ $LLAMA_EXTRA_ARGS}${draft:+, draft $draft}) on 127.0.0.1:$port, $concurrency slots; log $log" >&2
  setsid "$llama" -m "$MODEL" -t "$threads" --parallel "$concurrency" -fa off "${llama_extra[@]}" \
    "${draft_args[@]}" --host 127.0.0.1 --port "$port" -c $((4096 * concurrency)) >"$log" 2>&1 &
  srv_pid=$!
  if wait_healthy "http://127.0.0.1:$port/health" 300 "$name"; then
    run_client "$name" "http://127.0.0.1:$port"
  else
    tail -n 20 "$log" >&2
    status=1
  fi
  stop_server
}

run_round() {  # llama-server (when given), then every specula setting, one at a time
  if [ -n "$llama" ]; then
    for lsetting in $llama_settings; do
      lname="${lsetting%%:*}"
      ldraft=""
      [ "$lsetting" != "$lname" ] && ldraft="${lsetting#*:draft=}"
      run_llama "$lname" "$ldraft"
    done
  else
    echo "== llama-server: skipped (SKIP_LLAMA=1, or no binary: scripts/bench/build-llama-server.sh builds one)" >&2
  fi

  for setting in $settings; do
    IFS=: read -r name k policy proposer options <<<"$setting"
    [ -n "$name" ] && [ -n "$k" ] || { echo "serving.sh: bad setting '$setting'" >&2; exit 2; }
    api_port="$(free_port)"
    metrics_port="$(free_port)"
    while [ "$metrics_port" = "$api_port" ]; do metrics_port="$(free_port)"; done
    log="$out_dir/$tag-$name$suffix.log"
    echo "== specula $name (K=$k, policy ${policy:-default}) on 127.0.0.1:$api_port; log $log" >&2
    envs=(SPECULA_API_PORT="$api_port" SPECULA_METRICS_PORT="$metrics_port"
          SPECULA_NUM_SPEC_TOKENS="$k" SPECULA_MODEL="$MODEL")
    [ -n "${policy:-}" ] && envs+=(SPECULA_SPEC_POLICY="$policy")
    case "${proposer:-}" in
      "") ;;
      draft=*) envs+=(SPECULA_DRAFT_MODEL="${proposer#draft=}") ;;
      layers=*) envs+=(SPECULA_DRAFT_LAYERS="${proposer#layers=}") ;;
      head=*) envs+=(SPECULA_DRAFT_HEAD="${proposer#head=}") ;;
      *) envs+=(SPECULA_PROPOSER="$proposer") ;;
    esac
    kv="${SPECULA_KV_CACHE_DTYPE:-default}"
    IFS=: read -r -a more <<<"${options:-}"
    for option in "${more[@]}"; do
      case "$option" in
        kv=*) kv="${option#kv=}"; envs+=(SPECULA_KV_CACHE_DTYPE="$kv") ;;
        hugepages=*) envs+=(SPECULA_KV_CACHE_HUGE_PAGES="${option#hugepages=}") ;;
        *) echo "serving.sh: unknown option '$option' in setting '$setting'" >&2; exit 2 ;;
      esac
    done
    env "${envs[@]}" setsid scripts/serve.sh >"$log" 2>&1 &
    srv_pid=$!
    if wait_healthy "http://127.0.0.1:$api_port/health" "$start_timeout" "specula $name"; then
      run_client "$name" "http://127.0.0.1:$api_port"
      # The acceptance figures of the run, for scripts/bench/acceptance-report.py.
      python3 - "http://127.0.0.1:$metrics_port/metrics" >"$out_dir/$tag-$name$suffix.metrics" <<'PY' || true
import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
PY
      [ -f "$out_dir/$tag-$name$suffix.json" ] && spec_files[$kv]+=" $out_dir/$tag-$name$suffix.json"
      [ -n "$first_spec" ] || first_spec="$name"
    else
      tail -n 20 "$log" >&2
      status=1
    fi
    stop_server
  done
}

for ((round = 1; round <= rounds; round++)); do
  [ "$rounds" = 1 ] || { suffix="-r$round"; echo "== round $round of $rounds" >&2; }
  run_round
done

summary="$out_dir/$tag-summary.md"
{
  echo "## Serving benchmark: $workload, concurrency $concurrency, $num_prompts prompts"
  echo
} >"$summary"
for kv in "${!spec_files[@]}"; do
  read -r -a group <<<"${spec_files[$kv]}"
  [ ${#group[@]} -ge 2 ] || continue
  if cmp_out="$("${serving[@]}" --compare "${group[@]}")"; then
    echo "Greedy texts identical across specula settings with KV cache $kv (${#group[@]} runs)." >>"$summary"
  else
    { echo "**Greedy texts differ across specula settings with KV cache $kv:**"; echo '```'
      echo "$cmp_out"; echo '```'; } >>"$summary"
    status=1
  fi
  echo >>"$summary"
done
if [ ${#names[@]} -gt 0 ]; then
  results=()
  for name in "${names[@]}"; do results+=("$name=${files[$name]}"); done
  baselines=()
  if [ -n "${files[k0]+set}" ]; then baselines+=(--baseline k0)
  elif [ -n "$first_spec" ]; then baselines+=(--baseline "$first_spec"); fi
  [ -n "${files[llama-server]+set}" ] && baselines+=(--baseline llama-server)
  "${serving[@]}" --table "${results[@]}" "${baselines[@]}" >>"$summary" || status=1
fi
echo
cat "$summary"
echo "serving.sh: results in $out_dir ($tag-*.json, summary $summary)" >&2
exit "$status"
