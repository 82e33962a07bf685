#!/usr/bin/env python3
"""A tiny EAGLE-3 head and the outputs model.py computes for it, for the engine's test that its
Rust forward matches the training code's (a head trained here must draft the same tokens there).

    python3 scripts/draft_head/fixture.py OUTDIR

Writes OUTDIR/model.safetensors and OUTDIR/config.json (the published EAGLE-3 layout, weights in
float32 so nothing is rounded, plus the target embedding `embed_tokens.weight` the engine would
take from its target), and OUTDIR/reference.json:
  * tokens: the input tokens x_1..x_12 at positions 0..11; target_hidden: g [12, 3h];
  * catch_up: step 0 over positions 0..11 in one call (fc(g), logits, argmax, outs);
  * drafts: two draft steps as serving runs them from the catch-up's end c = 11: step 1 at
    position 12 reads the target id of step 0's argmax at 11 and f = out^0_11, attending to the
    cache (step 0 at 0..11) and itself; step 2 at position 13 likewise from step 1.
Everything is seeded, so the files are the same on every run. Floats are written with 9
significant digits (float32 exactly); the inputs g are rounded to 6 first, so the numbers in the
file are the very inputs the outputs were computed from.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Eagle3Head, HeadCache, HeadConfig, export_head  # noqa: E402

SEED = 7
CATCH_UP = 12
DRAFT_STEPS = 2


def tiny_config():
    return HeadConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                      rope_theta=10000.0, vocab_size=300, draft_vocab_size=100,
                      aux_layer_ids=[1, 2, 3], max_position_embeddings=2048)


def tiny_head(gen):
    """Random weights large enough that attention is far from uniform and the argmaxes clear;
    norm weights away from 1 so that a missing one shows."""
    cfg = tiny_config()
    head = Eagle3Head(cfg)
    std = {"fc.weight": 0.1, "lm_head.weight": 0.15}
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std.get(name, 0.15) * torch.randn(p.shape, generator=gen))
    ids = torch.sort(torch.randperm(cfg.vocab_size, generator=gen)[:cfg.draft_vocab_size]).values
    head.set_draft_vocab(ids)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    return head, embed


def rounded(x, digits):
    """float32 values that print exactly with `digits` significant digits."""
    flat = [np.float32(float(f"{v:.{digits}g}")) for v in x.reshape(-1).tolist()]
    return torch.tensor(np.array(flat, dtype=np.float32)).reshape(x.shape)


def as_list(x, digits=9):
    """Nested lists of floats with 9 significant digits (a float32 exactly), or `digits` for
    values already rounded to them."""
    if x.dim() > 1:
        return [as_list(r, digits) for r in x]
    return [float(f"{v:.{digits}g}") for v in x.tolist()]


def margin(logits):
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def reference(head, embed, tokens, g):
    """Serving's sequence: catch-up over 0..11, then two chained drafts."""
    cache = HeadCache()
    f0 = head.project(g)
    logits0, out0 = head.extend(cache, embed[tokens], f0, torch.arange(CATCH_UP))
    draft0 = logits0.argmax(-1)
    ref = {
        "catch_up": {
            "positions": list(range(CATCH_UP)),
            "fc": as_list(f0),
            "logits": as_list(logits0),
            "argmax_draft": draft0.tolist(),
            "argmax_target": head.draft_to_target(draft0).tolist(),
            "out": as_list(out0),
        },
        "drafts": [],
    }
    logits, out, pos = logits0[-1], out0[-1], CATCH_UP - 1
    chain_tokens, margins = [], [margin(logits0[-1])]
    for step in range(1, DRAFT_STEPS + 1):
        token = int(head.draft_to_target(logits.argmax()))
        pos += 1
        logits_, out_ = head.extend(cache, embed[[token]], out[None], [pos])
        logits, out = logits_[0], out_[0]
        d = int(logits.argmax())
        chain_tokens.append(token)
        margins.append(margin(logits))
        ref["drafts"].append({
            "step": step, "position": pos, "input_token": token,
            "logits": as_list(logits), "argmax_draft": d,
            "argmax_target": int(head.draft_to_target(torch.tensor(d))), "out": as_list(out),
        })
    return ref, chain_tokens, margins


@torch.no_grad()
def check_against_ttt(head, embed, tokens, g, ref, chain_tokens):
    """The same numbers from the training form: TTT over positions 0..13 with the drafted tokens
    at 12 and 13 (their step-0 rows are computed but not read by the steps checked)."""
    all_tokens = torch.cat([tokens, torch.tensor(chain_tokens)])
    g_pad = torch.cat([g, torch.zeros(DRAFT_STEPS, g.shape[1])])
    logits, outs = head.forward_steps(embed[all_tokens], g_pad, DRAFT_STEPS + 1)
    worst = float((outs[0][:CATCH_UP] - torch.tensor(ref["catch_up"]["out"])).abs().max())
    for d in ref["drafts"]:
        s, p = d["step"], d["position"]
        worst = max(worst, float((outs[s][p] - torch.tensor(d["out"])).abs().max()),
                    float((logits[s][p] - torch.tensor(d["logits"])).abs().max()))
    if worst > 1e-4:
        raise SystemExit(f"fixture: TTT and incremental forms differ by {worst}")
    return worst


def main(argv=None):
    p = argparse.ArgumentParser(description="Write a tiny EAGLE-3 head and its reference outputs.")
    p.add_argument("out", help="output directory")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    head, embed = tiny_head(gen)
    tokens = torch.randint(0, head.cfg.vocab_size, (CATCH_UP,), generator=gen)
    g = rounded(torch.randn(CATCH_UP, 3 * head.cfg.hidden_size, generator=gen), 6)
    ref, chain_tokens, margins = reference(head, embed, tokens, g)
    worst = check_against_ttt(head, embed, tokens, g, ref, chain_tokens)
    if min(margins) < 0.01:
        raise SystemExit(f"fixture: an argmax is nearly tied ({margins}); change SEED")
    if len(set(chain_tokens + [int(tokens[-1])])) < len(chain_tokens) + 1:
        raise SystemExit(f"fixture: drafted tokens repeat ({chain_tokens}); change SEED")

    export_head(head, args.out, dtype="f32", embed_tokens=embed)
    doc = {
        "description": "EAGLE-3 head reference outputs from scripts/draft_head/model.py: "
                       "catch-up (step 0) at positions 0..11, then draft steps 1 and 2 at "
                       "positions 12 and 13 from c = 11",
        "seed": SEED,
        "tolerance_relative": 1e-4,
        "tokens": tokens.tolist(),
        "target_hidden": as_list(g, 6),
        **ref,
        "argmax_margins": [round(m, 6) for m in margins],
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"fixture: wrote {args.out} (drafts {chain_tokens} -> "
          f"{ref['drafts'][-1]['argmax_target']}, TTT agrees within {worst:.1e}, "
          f"least argmax margin {min(margins):.3f})")


if __name__ == "__main__":
    main()
