"""Stage 1 of training a draft head: the target's own answers to ShareGPT prompts, served by
specula (self-distillation: the head learns to predict what the served model writes).

Each answer is a greedy chat completion (temperature 0) of the conversation's first human turn;
the prompt's token ids come from the server's /tokenize (the chat template applied), the answer's
from its logprobs with `return_tokens_as_token_ids`. One JSON line per conversation:
{"cid", "prompt_ids", "output_ids", "finish_reason"}. Appends, and skips conversations already in
the file, so a stopped run resumes.
"""

import http.client
import json
import os
import queue
import threading
import time
import urllib.parse

from sharegpt import first_turns


class Client:
    def __init__(self, url, timeout=600):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout

    def post(self, path, body):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{path}: HTTP {resp.status}: {data[:300]!r}")
            return json.loads(data)
        finally:
            conn.close()

    def model(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("GET", "/v1/models")
            return json.loads(conn.getresponse().read())["data"][0]["id"]
        finally:
            conn.close()


def answer(client, model, content, max_tokens):
    messages = [{"role": "user", "content": content}]
    prompt = client.post("/tokenize", {"messages": messages, "add_generation_prompt": True})
    out = client.post("/v1/chat/completions", {
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "logprobs": True, "return_tokens_as_token_ids": True,
    })
    choice = out["choices"][0]
    ids = [int(t["token"].split(":", 1)[1]) for t in choice["logprobs"]["content"]]
    return prompt["tokens"], ids, choice["finish_reason"]


def generate(url, out_path, split, limit, max_tokens, concurrency, log):
    done = set()
    if os.path.exists(out_path):
        with open(out_path) as f:
            for line in f:
                try:
                    done.add(json.loads(line)["cid"])
                except (ValueError, KeyError):
                    pass  # a line cut by a stopped run: its conversation is asked again
    client = Client(url)
    model = client.model()
    todo = queue.Queue()
    wanted = 0
    for cid, content in first_turns(split):
        if wanted >= limit:
            break
        wanted += 1
        if cid not in done:
            todo.put((cid, content))
    log(f"responses: {split}: {wanted} conversations, {len(done)} already answered, "
        f"{todo.qsize()} to ask")
    lock = threading.Lock()
    stats = {"answers": 0, "tokens": 0, "errors": 0}
    started = time.time()

    def worker(out):
        while True:
            try:
                cid, content = todo.get_nowait()
            except queue.Empty:
                return
            try:
                prompt_ids, output_ids, finish = answer(client, model, content, max_tokens)
            except (OSError, RuntimeError, KeyError, ValueError) as e:
                with lock:
                    stats["errors"] += 1
                log(f"responses: {cid}: {e}")
                continue
            line = json.dumps({"cid": cid, "prompt_ids": prompt_ids, "output_ids": output_ids,
                               "finish_reason": finish})
            with lock:
                out.write(line + "\n")
                out.flush()
                stats["answers"] += 1
                stats["tokens"] += len(output_ids)
                if stats["answers"] % 50 == 0:
                    rate = stats["tokens"] / max(time.time() - started, 1e-9)
                    log(f"responses: {stats['answers']} answers, {stats['tokens']} tokens, "
                        f"{rate:.0f} tok/s")

    with open(out_path, "a") as out:
        threads = [threading.Thread(target=worker, args=(out,)) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    log(f"responses: done: {stats['answers']} new answers, {stats['tokens']} tokens, "
        f"{stats['errors']} errors in {time.time() - started:.0f} s")
    if stats["errors"]:
        raise SystemExit("responses: some requests failed; run again to ask them")
