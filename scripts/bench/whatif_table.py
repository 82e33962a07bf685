#!/usr/bin/env python3
"""Predicted (from the first K's trace, `replay --what-if`) against measured (each K's own run)
for scripts/bench/whatif.sh: verification steps, accepted drafts per step and tokens/s.

Usage: whatif_table.py OUT_DIR "WORKLOADS" K...  (the first K is the re-scored one)
"""
import glob
import json
import sys


def measured(path):
    """Steps, accepted per step and tokens/s of a trace, as `--what-if` measures a run."""
    tokens, times, steps, accepted = 0, [], 0, 0
    with open(path) as f:
        next(f)
        for line in f:
            e = json.loads(line)
            tokens += len(e.get("tokens", []))
            times.append(e["t_us"])
            if e["type"] == "verify":
                steps += 1
                accepted += e["accepted"]
    return steps, accepted / max(steps, 1), tokens / ((max(times) - min(times)) / 1e6)


def main():
    out, workloads, ks = sys.argv[1], sys.argv[2].split(), [int(k) for k in sys.argv[3:]]
    print(f"| workload | K' | steps, predicted / measured | accepted per step, predicted / measured "
          f"| tok/s predicted (from the K={ks[0]} trace) | tok/s measured (trace) | error | tok/s (client) |")
    print("|---|---|---|---|---|---|---|---|")
    for w in workloads:
        with open(f"{out}/report-{w}/report.json") as f:
            report = json.load(f)
        fixed = {p["num_spec_tokens"]: p for p in report["what_if"] if p["policy"] == "fixed"}
        for k in ks:
            steps, acc, rate = measured(f"{out}/trace-{w}-k{k}.jsonl")
            p = fixed[k]
            client = [json.load(open(f)) for f in glob.glob(f"{out}/{w}-k{k}/*-k{k}.json")]
            client_rate = client[0]["summary"]["output_throughput"] if client else float("nan")
            err = p["predicted_tokens_per_s"] / rate - 1
            print(f"| {w} | {k} | {p['steps']} / {steps} | {p['accepted_per_step']:.3f} / {acc:.3f} "
                  f"| {p['predicted_tokens_per_s']:.1f} | {rate:.1f} | {err:+.1%} | {client_rate:.1f} |")


if __name__ == "__main__":
    main()
