"""Drives a running specula stack with the official `openai` client.

Usage: openai_e2e.py --base-url http://127.0.0.1:PORT/v1 --metrics-url http://127.0.0.1:PORT/metrics
                     --golden-dir ../shared/golden/smollm2 --num-spec-tokens K
                     [--dump-logprobs PATH]

Checks completions, chat, streaming (with usage), n=2, stop strings and error statuses, and that
each request's `speculate_metrics` (read from the raw JSON the server sent) equals what the
token-processor's Prometheus counters gained during that request; logprobs as evaluation
harnesses ask for them (lm-evaluation-harness's `local-completions` log-likelihood request: the
prompt as token ids, `echo=True`, `logprobs=1`, `max_tokens=1`) and as chat clients do. With
`--dump-logprobs` it writes the log-likelihood request's prompt and logprobs there, for the
caller to compare with a reference. Exits non-zero on the first failed check.
"""

import argparse
import json
import pathlib
import sys
import urllib.request

import openai

COUNTERS = {
    # speculate_metrics field -> token-processor counter (summed over label sets)
    "num_steps": "specula_spec_decode_num_steps_total",
    "num_drafts": "specula_spec_decode_num_drafts_total",
    "num_draft_tokens": "specula_spec_decode_num_draft_tokens_total",
    "num_accepted_draft_tokens": "specula_spec_decode_num_accepted_tokens_total",
    "accepted_tokens": "specula_spec_decode_num_emitted_tokens_total",
}
# Prompt tokens the worker's prefix cache held (usage.prompt_tokens_details.cached_tokens).
PREFIX_HITS = "specula_prefix_cache_hit_tokens_total"
# The worker's default KV block: only whole blocks are shared.
BLOCK_SIZE = 16


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def counters(url):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    sums = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS.values() or name == PREFIX_HITS:
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


def check_metrics_shape(m, k, what):
    check(isinstance(m, dict), f"{what}: speculate_metrics is an object")
    check(len(m["accept_ratio_per_head"]) == k, f"{what}: accept_ratio_per_head has K entries")
    check(len(m["accepted_tokens_per_head"]) == k + 1, f"{what}: accepted_tokens_per_head has K+1 entries")
    check(len(m["accept_length_histogram"]) == k + 1, f"{what}: histogram has K+1 entries")
    check(len(m["draft_length_histogram"]) == k + 1, f"{what}: draft-length histogram has K+1 entries")
    check(sum(m["draft_length_histogram"]) == m["num_steps"], f"{what}: draft-length histogram sums to the steps")
    check(
        sum(j * n for j, n in enumerate(m["draft_length_histogram"])) == m["num_draft_tokens"],
        f"{what}: draft-length histogram weighs to the draft tokens",
    )
    check(m["accepted_tokens_per_head"][0] == m["num_steps"], f"{what}: per-head[0] is the step count")


def check_against_tp(before, after, m, what):
    for field, counter in COUNTERS.items():
        delta = after.get(counter, 0.0) - before.get(counter, 0.0)
        check(delta == m[field], f"{what}: {field} {m[field]} equals the token-processor's +{delta}")


def check_logprobs(client, model, golden, dump):
    # lm-evaluation-harness's log-likelihood request: context + continuation as token ids.
    prompt = golden["prompt_ids"] + golden["greedy_ids"][:4]
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=1, temperature=0, echo=True, logprobs=1, seed=1234,
        extra_body={"return_tokens_as_token_ids": True},
    )
    lp = r.choices[0].logprobs
    check(len(lp.tokens) == len(prompt) + 1, "echo: the prompt's tokens and one output token")
    check([int(t.split(":")[1]) for t in lp.tokens[: len(prompt)]] == prompt, "echo: tokens are the prompt's")
    check(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "echo: the first prompt token has null logprobs")
    check(all(x <= 0.0 for x in lp.token_logprobs[1:]), "echo: every other logprob is <= 0")
    check(all(1 <= len(t) <= 2 for t in lp.top_logprobs[1:]), "echo: one alternative, plus the chosen token")
    if dump:
        pathlib.Path(dump).write_text(json.dumps({
            "prompt": prompt, "token_logprobs": lp.token_logprobs, "top_logprobs": lp.top_logprobs,
        }))

    # The same as text: the echo starts with the prompt, special tokens included.
    r = client.completions.create(model=model, prompt=golden["prompt"], max_tokens=4, temperature=0, echo=True)
    check(r.choices[0].text.startswith(golden["prompt"]) and len(r.choices[0].text) > len(golden["prompt"]),
          "echo: the text is the prompt, then the completion")

    # Chat: each output token's logprob and its top alternatives.
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8, temperature=0, logprobs=True, top_logprobs=2,
    )
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, "chat logprobs: one per output token")
    check(all(len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token for c in content),
          "chat logprobs: greedy tokens lead their top 2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--metrics-url", required=True)
    ap.add_argument("--golden-dir", required=True)
    ap.add_argument("--num-spec-tokens", type=int, required=True)
    ap.add_argument("--dump-logprobs")
    args = ap.parse_args()
    k = args.num_spec_tokens
    golden = json.loads((pathlib.Path(args.golden_dir) / "capital.json").read_text())
    want = golden["greedy_text_no_eos"]
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)

    models = client.models.list().data
    check(len(models) == 1, "one model listed")
    model = models[0].id

    # Completions, non-streaming: golden text and figures equal to the TP's.
    before = counters(args.metrics_url)
    r = client.completions.create(model=model, prompt=golden["prompt"], max_tokens=24, temperature=0)
    after = counters(args.metrics_url)
    check(r.id.startswith("cmpl-") and r.object == "text_completion", "completion id and object")
    check(r.choices[0].text == want, f"completion text {r.choices[0].text!r} == golden")
    check(r.choices[0].finish_reason == "stop", "completion finished at EOS")
    check(r.usage.prompt_tokens == len(golden["prompt_ids"]), "prompt_tokens equals the golden prompt length")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage totals add up")
    m = r.choices[0].model_extra["speculate_metrics"]
    if k == 0:
        check(m is None, "speculate_metrics null without speculation")
    else:
        check_metrics_shape(m, k, "completion")
        check_against_tp(before, after, m, "completion")

    # Chat, non-streaming: the chat template reproduces the golden prompt.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
    check(r.id.startswith("chatcmpl-") and r.object == "chat.completion", "chat id and object")
    check(r.choices[0].message.role == "assistant", "assistant role")
    check(r.choices[0].message.content == want, f"chat text {r.choices[0].message.content!r} == golden")
    check(r.usage.prompt_tokens == len(golden["prompt_ids"]), "chat prompt_tokens equals the golden prompt")
    # The same prompt as the completion above: its whole blocks, all but the block holding the
    # last token (whose logits are the answer), come from the prefix cache.
    cached = r.usage.prompt_tokens_details.cached_tokens
    check(cached == (r.usage.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE and cached > 0,
          f"chat: {cached} of {r.usage.prompt_tokens} prompt tokens from the prefix cache")

    # Chat, streaming with usage: metrics only in the final chunk, raw JSON as sent.
    before = counters(args.metrics_url)
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c.model_dump() for c in stream]
    after = counters(args.metrics_url)
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    check(text == want, f"streamed chat text {text!r} == golden")
    with_choice = [c for c in chunks if c["choices"]]
    final = [c for c in with_choice if c["choices"][0]["finish_reason"] is not None]
    check(len(final) == 1, "one final chunk")
    check(all(c["choices"][0]["speculate_metrics"] is None for c in with_choice if c is not final[0]),
          "speculate_metrics null in every other chunk")
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0, "usage chunk last")
    cached = chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    hits = after.get(PREFIX_HITS, 0) - before.get(PREFIX_HITS, 0)
    check(cached > 0 and hits == cached,
          f"stream: {cached} cached prompt tokens, the token-processor's hit counter +{hits}")
    m = final[0]["choices"][0]["speculate_metrics"]
    if k > 0:
        check_metrics_shape(m, k, "stream")
        check_against_tp(before, after, m, "stream")
    else:
        check(m is None, "stream speculate_metrics null without speculation")

    # Completions, streaming.
    stream = client.completions.create(model=model, prompt=golden["prompt"], max_tokens=24, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    check(text == want, "streamed completion text == golden")

    # n=2: two choices, each its own engine request with its own figures.
    r = client.completions.create(model=model, prompt=golden["prompt"], max_tokens=8, temperature=0.8, seed=3, n=2)
    check(sorted(c.index for c in r.choices) == [0, 1], "n=2 gives choices 0 and 1")
    if k > 0:
        for c in r.choices:
            check_metrics_shape(c.model_extra["speculate_metrics"], k, f"n=2 choice {c.index}")

    # Stop strings are cut from the text.
    r = client.completions.create(model=model, prompt=golden["prompt"], max_tokens=24, temperature=0, stop=[" Paris"])
    check(r.choices[0].text == want[: want.index(" Paris")], f"stop string cut: {r.choices[0].text!r}")
    check(r.choices[0].finish_reason == "stop", "stop string finishes with stop")

    check_logprobs(client, model, golden, args.dump_logprobs)

    # Errors arrive as the client's typed exceptions.
    try:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
        check(False, "unknown model rejected")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "unknown model is a 404")
    try:
        client.completions.create(model=model, prompt="hi", max_tokens=4, temperature=-1)
        check(False, "negative temperature rejected")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "temperature", "bad temperature is a 400 naming it")
    print("all checks passed")


if __name__ == "__main__":
    main()
