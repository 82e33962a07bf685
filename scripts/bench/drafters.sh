#!/usr/bin/env bash
# What each drafter is worth: per-head acceptance of the lookup proposers and of model drafters
# (draft models made from the default model by scripts/make-draft.py, and --draft-layers) on the
# serving workloads, then serving speed of the default policy with each against K=0.
#
# Usage: scripts/bench/drafters.sh [acceptance|serving|all]      (default all)
# Environment:
#   OUT_DIR        results (default /tmp/specula-drafters): per workload serving.sh's files,
#                  <workload>-acceptance.md, and acceptance-<workload>.svg
#   WORKLOADS      (default "sharegpt humaneval grounded"), for the acceptance part
#   NUM_PROMPTS    prompts per run (default 16); MAX_TOKENS per request (default 64)
#   CONCURRENCY    clients for the acceptance part (default 8)
#   SERVING_CONCURRENCIES  clients for the serving part (default "1 8")
#   DRAFT_LAYERS   N of the --draft-layers setting (default 10)
#   SERVING_DRAFTERS  drafters of the serving part (default "q4_0-copy first10 first20
#                  layers<N> mirrored"; all: first6 and first15 too)
#   SKIP_LLAMA=1   no llama-server in the serving part (it runs, when
#                  scripts/bench/build-llama-server.sh has built it, with --model-draft on the
#                  same draft files: llama-<drafter>; layers<N> gets first<N>.gguf, the same
#                  function). The acceptance part never runs it.
# The acceptance part runs every drafter with --spec-policy fixed (each step drafts K = 4, so the
# figures describe the drafter, not the policy); the serving part runs the default policy
# (goodput), which drafts only where the draft pays. Needs gguf and numpy for make-draft.py:
# scripts/setup-python.sh puts them in .venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

part="${1:-all}"
out="${OUT_DIR:-/tmp/specula-drafters}"
workloads="${WORKLOADS:-sharegpt humaneval grounded}"
num_prompts="${NUM_PROMPTS:-16}"
max_tokens="${MAX_TOKENS:-64}"
concurrency="${CONCURRENCY:-8}"
draft_layers="${DRAFT_LAYERS:-10}"
skip_llama="${SKIP_LLAMA:-0}"
mkdir -p "$out/drafts"

scripts/fetch-model.sh >/dev/null
scripts/setup-python.sh
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
make() {  # NAME make-draft args...
  local file="$out/drafts/$1.gguf"
  shift
  [ -f "$file" ] || .venv/bin/python scripts/make-draft.py "$model" "$file" "$@" >&2
}
make q4_0-copy --quant q4_0
make first6 --layers 6
make first10 --layers 10
make first15 --layers 15
make first20 --layers 20
make "first$draft_layers" --layers "$draft_layers"
make mirrored --bad
d="$out/drafts"
serving_drafters="${SERVING_DRAFTERS:-q4_0-copy first10 first20 layers$draft_layers mirrored}"
[ "$serving_drafters" = all ] && serving_drafters="q4_0-copy first6 first10 first15 first20 layers$draft_layers mirrored"

drafters="q4_0-copy:draft=$d/q4_0-copy.gguf first6:draft=$d/first6.gguf first10:draft=$d/first10.gguf"
drafters+=" first15:draft=$d/first15.gguf first20:draft=$d/first20.gguf layers$draft_layers:layers=$draft_layers mirrored:draft=$d/mirrored.gguf"

if [ "$part" = acceptance ] || [ "$part" = all ]; then
  for workload in $workloads; do
    settings="ngram:4:fixed:ngram suffix:4:fixed:suffix"
    for dr in $drafters; do settings+=" ${dr%%:*}:4:fixed:${dr#*:}"; done
    SKIP_LLAMA=1 OUT_DIR="$out/$workload" SPECULA_SETTINGS="$settings" SERVING_ARGS="--max-tokens $max_tokens" \
      scripts/bench/serving.sh "$workload" "$concurrency" "$num_prompts"
    tag="$workload-c$concurrency-n$num_prompts"
    runs=()
    for s in $settings; do runs+=("${s%%:*}=$out/$workload/$tag-${s%%:*}.metrics"); done
    python3 scripts/bench/acceptance-report.py "${runs[@]}" --svg "$out/acceptance-$workload.svg" \
      --title "Acceptance by draft position, $workload (K=4, fixed)" | tee "$out/$workload-acceptance.md"
  done
fi

if [ "$part" = serving ] || [ "$part" = all ]; then
  for c in ${SERVING_CONCURRENCIES:-1 8}; do
    settings="k0:0:fixed"
    llama_settings="llama-server"
    for dr in $drafters; do
      [[ " $serving_drafters " == *" ${dr%%:*} "* ]] || continue
      settings+=" ${dr%%:*}:4:goodput:${dr#*:}"
      case "${dr#*:}" in
        draft=*) llama_settings+=" llama-${dr%%:*}:${dr#*:}" ;;
        layers=*) llama_settings+=" llama-${dr%%:*}:draft=$d/first${dr#*:layers=}.gguf" ;;
      esac
    done
    SKIP_LLAMA="$skip_llama" LLAMA_SETTINGS="$llama_settings" OUT_DIR="$out/serving" SPECULA_SETTINGS="$settings" SERVING_ARGS="--max-tokens $max_tokens" \
      scripts/bench/serving.sh sharegpt "$c" "$num_prompts"
  done
fi
