"""Structured output through the official `openai` client: 50 JSON schemas of varied shape
(objects nested two deep, arrays, enums, consts, anyOf, numbers with bounds, optional
properties, patterns), each asked for with `response_format` `json_schema`, greedy; and one
`json_object` request. Every output must parse and validate against its schema (`jsonschema`),
and finish at EOS, not at the length limit.

Usage: structured_output.py --base-url http://127.0.0.1:PORT/v1 [--dump PATH] [--concurrency N]

Prints one JSON line with the totals (requests, completion tokens, wall seconds, tokens/s, and
the speculative figures summed: steps, drafted and accepted tokens) and, with --dump, writes
every output text there, for the caller to compare runs.
"""

import argparse
import concurrent.futures
import json
import random
import sys
import time

import jsonschema
import openai

NAMES = ["name", "city", "title", "color", "label", "owner", "kind", "tag", "note", "unit"]


def leaf(rng):
    k = rng.randrange(8)
    if k == 0:
        return {"type": "string", "maxLength": rng.choice([8, 16, 24])}
    if k == 1:
        return {"type": "integer", "minimum": 0, "maximum": rng.choice([9, 99, 1000])}
    if k == 2:
        return {"type": "number", "minimum": -10, "maximum": 10}
    if k == 3:
        return {"type": "boolean"}
    if k == 4:
        return {"enum": rng.sample(["red", "green", "blue", "small", "large", "yes", "no"], 3)}
    if k == 5:
        return {"type": "string", "pattern": "^[a-z]{2,6}$"}
    if k == 6:
        return {"const": rng.choice(["v1", 7, True])}
    return {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "string", "maxLength": 8}]}


def obj(rng, depth):
    keys = rng.sample(NAMES, rng.randrange(1, 5))
    props = {}
    for key in keys:
        r = rng.random()
        if depth < 2 and r < 0.2:
            props[key] = obj(rng, depth + 1)
        elif r < 0.4:
            props[key] = {"type": "array", "items": leaf(rng), "minItems": 1, "maxItems": 3}
        else:
            props[key] = leaf(rng)
    required = [k for k in keys if rng.random() < 0.8] or keys[:1]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def schemas(n):
    rng = random.Random(36)
    out = [obj(rng, 0) for _ in range(n - 2)]
    # Two that are not objects at the top.
    out.append({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4})
    out.append({"enum": ["alpha", "beta", "gamma"]})
    return out


def ask(client, model, i, schema):
    r = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Answer in JSON."},
            {"role": "user", "content": f"Give example {i} of a record with these fields: {json.dumps(schema)}"},
        ],
        max_tokens=256,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
    )
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--dump")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--count", type=int, default=50)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    cases = schemas(args.count)
    for s in cases:
        jsonschema.Draft202012Validator.check_schema(s)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda c: ask(client, model, c[0], c[1]), enumerate(cases)))
    wall = time.monotonic() - started

    totals = {"requests": len(results), "completion_tokens": 0, "steps": 0, "draft_tokens": 0, "accepted": 0}
    texts = []
    failures = []
    for i, (schema, r) in enumerate(zip(cases, results)):
        text = r.choices[0].message.content
        texts.append(text)
        totals["completion_tokens"] += r.usage.completion_tokens
        m = r.choices[0].model_extra.get("speculate_metrics")
        if m:
            totals["steps"] += m["num_steps"]
            totals["draft_tokens"] += m["num_draft_tokens"]
            totals["accepted"] += m["num_accepted_draft_tokens"]
        try:
            jsonschema.validate(json.loads(text), schema)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            failures.append(f"schema {i}: {text!r}: {e}")
            continue
        if r.choices[0].finish_reason != "stop":
            failures.append(f"schema {i}: finished by {r.choices[0].finish_reason}: {text!r}")

    # Any JSON object.
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give a JSON object with the name and age of a person."}],
        max_tokens=256, temperature=0, response_format={"type": "json_object"},
    )
    try:
        value = json.loads(r.choices[0].message.content)
        if not isinstance(value, dict):
            failures.append(f"json_object: not an object: {value!r}")
    except json.JSONDecodeError as e:
        failures.append(f"json_object: {r.choices[0].message.content!r}: {e}")
    texts.append(r.choices[0].message.content)

    # A schema the grammar engine cannot compile is a 400 naming response_format.
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}},
        )
        failures.append("an uncompilable schema was served")
    except openai.BadRequestError as e:
        if e.body.get("param") != "response_format":
            failures.append(f"an uncompilable schema's 400 names {e.body.get('param')!r}")

    totals["wall_s"] = round(wall, 2)
    totals["tokens_per_s"] = round(totals["completion_tokens"] / wall, 1)
    if totals["steps"]:
        totals["mean_accepted_per_step"] = round(totals["accepted"] / totals["steps"], 3)
    print(json.dumps(totals))
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(texts, f)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    if failures:
        sys.exit(1)
    print(f"all {len(cases)} schemas validated")


if __name__ == "__main__":
    main()
