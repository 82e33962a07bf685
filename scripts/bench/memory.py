#!/usr/bin/env python3
"""Resident memory of a serving process around a burst: RSS before, at the peak of a burst of
N concurrent greedy completions (sampled every 50 ms), and after it drained.

Usage: memory.py --url http://127.0.0.1:PORT --pid PID [--n 64] [--max-tokens 128] [--label X]
Prints one JSON line: {"label", "n", "rss_start_kib", "rss_peak_kib", "rss_after_kib", "ok"}.
The prompts differ (so no two share a cached prefix) and run past EOS (ignore_eos), so the
burst writes N × (prompt + max_tokens) positions of KV cache.
"""
import argparse
import json
import threading
import time
import urllib.request


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def complete(url, i, max_tokens, results):
    body = {
        "prompt": f"Request {i}: write a long list of facts about the number {i * 7919}.",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            results[i] = response.status == 200
    except Exception:  # noqa: BLE001 - any failure counts as not ok
        results[i] = False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    start = rss_kib(args.pid)
    results = [None] * args.n
    threads = [
        threading.Thread(target=complete, args=(args.url, i, args.max_tokens, results))
        for i in range(args.n)
    ]
    for t in threads:
        t.start()
    peak = start
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_kib(args.pid))
        time.sleep(0.05)
    for t in threads:
        t.join()
    time.sleep(2)
    after = rss_kib(args.pid)
    print(json.dumps({
        "label": args.label, "n": args.n, "max_tokens": args.max_tokens,
        "rss_start_kib": start, "rss_peak_kib": max(peak, after), "rss_after_kib": after,
        "ok": all(results),
    }))


if __name__ == "__main__":
    main()
