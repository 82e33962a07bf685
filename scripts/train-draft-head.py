#!/usr/bin/env python3
"""Trains an EAGLE-3 draft head for a target model served by specula (self-distillation, as
EAGLE-3 and its successors train: Li et al. 2025, arXiv 2503.01840).

    scripts/train-draft-head.py TARGET OUT [--url URL] [--train-conversations N] ...

TARGET is the target model file (GGUF or Hugging Face directory); OUT a work directory. Stages,
each skipped when its output is complete, so a stopped run resumes where it was:

  1. responses   the target's own greedy answers to ShareGPT first turns, asked of a running
                 specula (--url; `scripts/serve.sh` serves TARGET), for the training split and
                 the validation split (scripts/draft_head/sharegpt.py says which conversations
                 are held out: every one the project's benchmarks read, and a hashed sample);
  2. extract     the engine's own hidden states for every position of those sequences
                 (engine-worker's `dump-hidden` binary: the captured residual streams a served
                 head reads, not a Python copy of the model);
  3. train       scripts/draft_head/train.py: training-time test over the draft vocabulary of the
                 most frequent response tokens, checkpoints every few hundred steps;
  4. export      OUT/train/head: config.json + model.safetensors in the published layout
                 (LlamaForCausalLMEagle3, d2t/t2d) with training.json (command, seed, data
                 manifest, validation acceptance by position).

Training needs PyTorch (scripts/draft_head/setup.sh makes .venv-train with it); serving and CI
never do. Run this script with that environment's python, or it re-executes itself with it.
"""

import argparse
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HERE = os.path.join(ROOT, "scripts", "draft_head")
VENV_PYTHON = os.path.join(ROOT, ".venv-train", "bin", "python")
sys.path.insert(0, HERE)


def log(msg):
    print(f"train-draft-head: {msg}", file=sys.stderr, flush=True)


def lines(path):
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def stage_responses(args, split, limit, path):
    import responses

    if lines(path) >= limit:
        log(f"responses ({split}): {path} complete")
        return
    if not args.url:
        sys.exit("train-draft-head: --url of a running specula is needed to ask for responses "
                 "(scripts/serve.sh serves the target)")
    responses.generate(args.url, path, split, limit, args.max_tokens, args.concurrency, log)


def stage_extract(args, responses_path, out_dir):
    index = os.path.join(out_dir, "index.jsonl")
    if lines(index) >= lines(responses_path) and lines(index) > 0:
        log(f"extract: {out_dir} complete")
        return
    binary = os.path.join(args.bin_dir, "dump-hidden")
    if not os.path.exists(binary):
        subprocess.run(["cargo", "build", "--release", "-p", "engine-worker", "--bin",
                        "dump-hidden"], cwd=ROOT, check=True)
        binary = os.path.join(ROOT, "target", "release", "dump-hidden")
    subprocess.run([binary, "--model", args.target, "--input", responses_path, "--out", out_dir],
                   check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", help="target model (GGUF file or Hugging Face directory)")
    ap.add_argument("out", help="work directory (responses, hidden states, checkpoints, head)")
    ap.add_argument("--url", help="a running specula serving TARGET, for stage 1")
    ap.add_argument("--train-conversations", type=int, default=1600,
                    help="training conversations to answer (default %(default)s)")
    ap.add_argument("--val-conversations", type=int, default=120,
                    help="held-out validation conversations (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=256, help="answer length cap")
    ap.add_argument("--concurrency", type=int, default=16, help="parallel requests in stage 1")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"),
                    help="where dump-hidden is (built when missing)")
    ap.add_argument("--stop-after", choices=["responses", "extract", "train"],
                    help="stop after this stage")
    args, train_args = ap.parse_known_args()
    if os.path.abspath(sys.executable) != os.path.abspath(VENV_PYTHON) and os.path.exists(VENV_PYTHON):
        os.execv(VENV_PYTHON, [VENV_PYTHON] + sys.argv)
    os.makedirs(args.out, exist_ok=True)
    train_resp = os.path.join(args.out, "train-responses.jsonl")
    val_resp = os.path.join(args.out, "val-responses.jsonl")
    stage_responses(args, "validation", args.val_conversations, val_resp)
    stage_responses(args, "train", args.train_conversations, train_resp)
    if args.stop_after == "responses":
        return
    train_dir, val_dir = os.path.join(args.out, "train-hidden"), os.path.join(args.out, "val-hidden")
    stage_extract(args, val_resp, val_dir)
    stage_extract(args, train_resp, train_dir)
    if args.stop_after == "extract":
        return
    import train

    train.main(["--data", train_dir, "--val", val_dir, "--out", os.path.join(args.out, "train")]
               + train_args)


if __name__ == "__main__":
    main()
