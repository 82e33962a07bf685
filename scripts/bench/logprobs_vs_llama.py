"""Compares specula's logprobs with llama-server's on the golden prompts (token ids), greedy,
16 tokens, top 5. specula: /v1/completions with `logprobs` 5 and `return_tokens_as_token_ids`;
llama-server: /completion with `n_probs` 5 (`post_sampling_probs` false: the model's
distribution, as specula reports). Per prompt: how many leading tokens both chose alike; over
those positions and the first where they part (the texts differ after it), how many of the top 5
they share on average and the largest and mean |difference| of the logprobs of the tokens both
list; and where they part, specula's margin between its top two tokens (a near-tie that
llama.cpp's 8-bit activations can flip). Prints a Markdown table.

Usage: logprobs_vs_llama.py --specula http://127.0.0.1:8000 --llama http://127.0.0.1:8080
                            [--golden ../shared/golden/smollm2]
"""

import argparse
import json
import pathlib
import urllib.request

TOKENS = 16
TOP = 5


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=300).read())


def specula(base, prompt):
    r = post(f"{base}/v1/completions", {
        "prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
        "logprobs": TOP, "return_tokens_as_token_ids": True,
    })
    lp = r["choices"][0]["logprobs"]
    out = []
    for tok, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        tid = int(tok.split(":")[1])
        alts = {int(k.split(":")[1]): v for k, v in top.items()}
        # The legacy shape adds the chosen token to its top: keep the 5 most likely.
        best = dict(sorted(alts.items(), key=lambda kv: -kv[1])[:TOP])
        out.append((tid, logprob, best))
    return out


def llama(base, prompt):
    r = post(f"{base}/completion", {
        "prompt": prompt, "n_predict": TOKENS, "temperature": 0, "ignore_eos": True,
        "n_probs": TOP, "post_sampling_probs": False, "cache_prompt": False,
    })
    out = []
    for p in r["completion_probabilities"]:
        alts = {a["id"]: a["logprob"] for a in p["top_logprobs"]}
        out.append((p["id"], p["logprob"], alts))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specula", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--golden", default=str(pathlib.Path(__file__).resolve().parents[3] / "shared/golden/smollm2"))
    args = ap.parse_args()
    print("| prompt | same leading tokens | top-5 shared (mean) | max abs logprob diff | mean abs logprob diff | specula's top-2 margin where they part |")
    print("|---|---|---|---|---|---|")
    for path in sorted(pathlib.Path(args.golden).glob("*.json")):
        if path.stem == "tokenizer":
            continue
        prompt = json.loads(path.read_text())["prompt_ids"]
        a, b = specula(args.specula, prompt), llama(args.llama, prompt)
        same, margin = 0, "-"
        diffs, shared = [], []
        for (ta, _, topa), (tb, _, topb) in zip(a, b):
            common = set(topa) & set(topb)
            shared.append(len(common))
            diffs.extend(abs(topa[t] - topb[t]) for t in common)
            if ta != tb:
                ranked = sorted(topa.values(), reverse=True)
                margin = f"{ranked[0] - ranked[1]:.3f}"
                break
            same += 1
        print(f"| {path.stem} | {same} of {TOKENS} | {sum(shared) / len(shared):.2f} | {max(diffs):.4f} | "
              f"{sum(diffs) / len(diffs):.4f} | {margin} |")


if __name__ == "__main__":
    main()
