#!/usr/bin/env python3
"""Self-test of the draft-head training code (plain asserts, one thread, well under a minute):

    .venv-train/bin/python scripts/draft_head/test_model.py

  1. TTT (model.forward_steps) computes, at step j and position p, what serving's incremental
     chain computes: checked against a separate, deliberately naive per-token implementation
     written here (explicit RoPE pairs, explicit per-head softmax, a list as KV cache), for every
     catch-up end c and every step j; model.extend (the fixture's form) against it too;
  2. training on a small synthetic dump lowers the loss and writes every output;
  3. export then load_head round-trips (f32 exactly, bf16 within rounding);
  4. a run stopped by --max-steps and run again continues at the same step, with the same
     weights as a run that never stopped.
"""

import json
import math
import os
import sys
import tempfile
import time

import torch

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train  # noqa: E402
from model import Eagle3Head, HeadCache, HeadConfig, export_head, load_head  # noqa: E402
from synthetic import write_dump  # noqa: E402


# ---------------------------------------------------------------------------------------------
# A naive incremental reference


def naive_rms(x, w, eps):
    return x / math.sqrt(float((x * x).mean()) + eps) * w


def naive_rope(x, pos, theta):
    """x [hd]: pairs (i, i + hd/2) turned by pos * theta^(-2i/hd)."""
    hd = x.shape[0]
    y = x.clone()
    for i in range(hd // 2):
        a = pos * theta ** (-2.0 * i / hd)
        c, s = math.cos(a), math.sin(a)
        y[i] = x[i] * c - x[i + hd // 2] * s
        y[i + hd // 2] = x[i + hd // 2] * c + x[i] * s
    return y


def naive_step(w, cfg, cache, e, f, pos):
    """One row at `pos`: appends its (k, v) to `cache` (a list), attends to all of it."""
    H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    z = torch.cat([naive_rms(e, w["midlayer.input_layernorm.weight"], eps),
                   naive_rms(f, w["midlayer.hidden_norm.weight"], eps)])
    q = (w["midlayer.self_attn.q_proj.weight"] @ z).view(H, hd)
    k = (w["midlayer.self_attn.k_proj.weight"] @ z).view(KV, hd)
    v = (w["midlayer.self_attn.v_proj.weight"] @ z).view(KV, hd)
    k = torch.stack([naive_rope(k[i], pos, cfg.rope_theta) for i in range(KV)])
    cache.append((k, v))
    heads = []
    for h in range(H):
        qh = naive_rope(q[h], pos, cfg.rope_theta)
        kv = h // (H // KV)
        scores = torch.tensor([float(qh @ ck[kv]) / math.sqrt(hd) for ck, _ in cache])
        p = torch.softmax(scores, 0)
        heads.append(sum(p[i] * cv[kv] for i, (_, cv) in enumerate(cache)))
    r = f + w["midlayer.self_attn.o_proj.weight"] @ torch.cat(heads)
    x = naive_rms(r, w["midlayer.post_attention_layernorm.weight"], eps)
    gate = w["midlayer.mlp.gate_proj.weight"] @ x
    up = w["midlayer.mlp.up_proj.weight"] @ x
    m = w["midlayer.mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * up)
    out = r + m
    logits = w["lm_head.weight"] @ naive_rms(out, w["norm.weight"], eps)
    return logits, out


def random_head(seed=0):
    cfg = HeadConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, vocab_size=50, draft_vocab_size=20,
                     aux_layer_ids=[1, 2, 3], rope_theta=500.0)
    g = torch.Generator().manual_seed(seed)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    head.set_draft_vocab(torch.sort(torch.randperm(50, generator=g)[:20]).values)
    return head, g


@torch.no_grad()
def test_ttt_matches_incremental():
    head, g = random_head()
    cfg, T, S = head.cfg, 9, 4
    w = {k: v.double() if v.is_floating_point() else v for k, v in head.state_dict().items()}
    embeds = torch.randn(T, cfg.hidden_size, generator=g)
    hidden = torch.randn(T, 3 * cfg.hidden_size, generator=g)
    logits, outs = head.forward_steps(embeds, hidden, S)
    f0 = (w["fc.weight"] @ hidden.double().T).T
    # step 0: the catch-up, one row at a time
    base, step0 = [], []
    for p in range(T):
        step0.append(naive_step(w, cfg, base, embeds[p].double(), f0[p], p))
    worst = 0.0
    for p in range(T):
        worst = max(worst, float((outs[0][p] - step0[p][1]).abs().max()),
                    float((logits[0][p] - step0[p][0]).abs().max()))
    checked = 0
    for c in range(T):  # the target verified up to c; drafts at c+1, c+2, ...
        cache = list(base[:c + 1])
        out = step0[c][1]
        for j in range(1, S):
            p = c + j
            if p >= T:
                break
            lg, out = naive_step(w, cfg, cache, embeds[p].double(), out, p)
            worst = max(worst, float((outs[j][p] - out).abs().max()),
                        float((logits[j][p] - lg).abs().max()))
            checked += 1
    assert checked == sum(max(0, T - j) for j in range(1, S))
    assert worst < 1e-4, worst

    # the serving form in model.py: catch-up in one call, drafts one row each
    cache = HeadCache()
    lg0, o0 = head.extend(cache, embeds[:5], head.project(hidden[:5]), torch.arange(5))
    lg1, o1 = head.extend(cache, embeds[5:6], o0[-1:], [5])
    lg2, o2 = head.extend(cache, embeds[6:7], o1, [6])
    assert float((o0 - outs[0][:5]).abs().max()) < 1e-4
    assert float((o1[0] - outs[1][5]).abs().max()) < 1e-4
    assert float((o2[0] - outs[2][6]).abs().max()) < 1e-4
    assert float((lg2[0] - logits[2][6]).abs().max()) < 1e-4
    print(f"ok  TTT == incremental chain ({checked} drafts, max diff {worst:.1e})")


def test_vocab_maps():
    head, _ = random_head()
    ids = head.draft_to_target(torch.arange(20))
    assert bool((ids[1:] > ids[:-1]).all()) and int(head.t2d.sum()) == 20
    assert bool(head.t2d[ids].all())
    table = head.target_to_draft_table()
    assert bool((table[ids] == torch.arange(20)).all()) and int((table >= 0).sum()) == 20
    print("ok  d2t / t2d")


# ---------------------------------------------------------------------------------------------
# Training, export, resume


def train_args(tmp, out, *extra):
    return ["--data", os.path.join(tmp, "train"), "--val", os.path.join(tmp, "val"),
            "--out", os.path.join(tmp, out), "--draft-vocab", "48", "--tokens-per-step", "240",
            "--lr", "1e-2", "--warmup-steps", "2", "--log-every", "1", "--checkpoint-every",
            "4", "--seed", "3", "--threads", "1", *extra]


def test_training(tmp):
    started = time.time()
    t = train.main(train_args(tmp, "run", "--epochs", "4"))
    out = os.path.join(tmp, "run")
    logs = [json.loads(x) for x in open(os.path.join(out, "train-log.jsonl"))]
    first, last = logs[0]["loss"], logs[-1]["loss"]
    assert last[0] < 0.5 * first[0], (first, last)
    assert all(len(r["loss"]) == 3 for r in logs)
    val = json.load(open(os.path.join(out, "validation.json")))
    assert [v["epoch"] for v in val] == [0, 1, 2, 3], val
    assert val[-1]["mean_accepted_length"] > val[0]["mean_accepted_length"]
    assert len(val[-1]["accept_ratio_per_position"]) == 4
    info = json.load(open(os.path.join(out, "head", "training.json")))
    assert info["validation"]["step"] == t.state["step"] == t.total_steps
    assert info["data"][0]["sequences"] == 48 and len(info["data"][0]["index_sha256"]) == 64
    freq = json.load(open(os.path.join(out, "token-frequencies.json")))
    assert freq["draft_vocab_size"] == 48
    cfg = json.load(open(os.path.join(out, "head", "config.json")))
    assert cfg["draft_vocab_size"] == 48
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    print(f"ok  training: loss {first[0]:.3f} -> {last[0]:.3f} in {len(logs)} steps, mean "
          f"accepted length {val[0]['mean_accepted_length']:.2f} -> "
          f"{val[-1]['mean_accepted_length']:.2f} ({time.time() - started:.1f} s)")
    return t


@torch.no_grad()
def test_export_roundtrip(tmp, trained):
    head = trained.head
    for dtype, tol in (("f32", 0.0), ("bf16", 1e-2)):
        d = os.path.join(tmp, f"export-{dtype}")
        export_head(head, d, dtype=dtype, embed_tokens=trained.embed)
        back, embed = load_head(d)
        assert back.cfg == head.cfg
        for k, v in head.state_dict().items():
            got = back.state_dict()[k]
            assert got.dtype == v.dtype, k
            if v.is_floating_point():
                assert float((got - v).abs().max()) <= tol * max(1.0, float(v.abs().max())), k
            else:
                assert torch.equal(got, v), k
        rounded = trained.embed.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        assert torch.equal(embed, rounded.float())
    # the training export (bf16, no embedding) loads too and names what vLLM/SGLang expect
    back, embed = load_head(os.path.join(tmp, "run", "head"))
    assert embed is None
    names = set(back.state_dict())
    assert {"fc.weight", "midlayer.hidden_norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    print("ok  export / load round trip (f32 exact, bf16 within rounding)")


def test_resume(tmp):
    whole = train.main(train_args(tmp, "whole", "--epochs", "2", "--max-steps", "6"))
    part = train.main(train_args(tmp, "parts", "--epochs", "2", "--max-steps", "3"))
    assert part.state["step"] == 3
    blob = torch.load(os.path.join(tmp, "parts", "checkpoint.pt"), weights_only=False)
    assert blob["step"] == 3 and blob["batch"] == 3
    again = train.main(train_args(tmp, "parts", "--epochs", "2", "--max-steps", "6"))
    assert again.state["step"] == 6 == whole.state["step"]
    assert again.sched.last_epoch == whole.sched.last_epoch == 6
    for k, v in whole.head.state_dict().items():
        assert torch.equal(v, again.head.state_dict()[k]), k
    logs = [json.loads(x)["step"] for x in open(os.path.join(tmp, "parts", "train-log.jsonl"))]
    assert logs == [1, 2, 3, 4, 5, 6], logs
    assert again.state["epoch"] == 0 and again.state["batch"] == 6
    val = json.load(open(os.path.join(tmp, "parts", "validation.json")))
    assert [v["step"] for v in val] == [3, 6], val
    print("ok  resume continues at step 3 and matches an unbroken run bit for bit")


def main():
    started = time.time()
    test_vocab_maps()
    test_ttt_matches_incremental()
    with tempfile.TemporaryDirectory() as tmp:
        write_dump(os.path.join(tmp, "train"), sequences=48, seq_len=40, prompt_len=6, seed=1)
        write_dump(os.path.join(tmp, "val"), sequences=6, seq_len=40, prompt_len=6, seed=2)
        trained = test_training(tmp)
        test_export_roundtrip(tmp, trained)
        test_resume(tmp)
    print(f"all ok in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
