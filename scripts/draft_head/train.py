#!/usr/bin/env python3
"""Stage 3 of training a draft head: trains an EAGLE-3 head (model.py) on the target's hidden
states that the engine's `dump-hidden` binary wrote, validates its acceptance, and exports it in
the published EAGLE-3 layout that the engine (and vLLM/SGLang) load.

    python3 scripts/draft_head/train.py --data DIR [--data DIR ...] --val DIR --out OUTDIR

Why it looks the way it does:
  * Self-distillation: the sequences' responses are the target's own greedy output, so the label
    at each position is the target's argmax; the loss is cross-entropy against that hard label,
    over a reduced draft vocabulary (the most frequent response tokens), only where the label is
    a response token in that vocabulary.
  * Training-time test (TTT, the EAGLE-3 paper's): each sequence runs S chained steps, step j
    fed with step j-1's own outputs and attending the way serving does; step j's loss weighs
    0.8^j.
  * Runs on CPUs for days if need be, so it checkpoints often and a stopped run resumes where it
    was, bit for bit, when run again with the same arguments; the batch order of every epoch is
    a function of --seed and the epoch alone.
  * Validation measures what serving gets: acceptance by position of greedy chain drafting with
    K=4, exact for a greedy target (a draft is compared only when every earlier one was
    accepted, and then the drafted tokens are the sequence's own).

Input DIR (from dump-hidden): meta.json, hidden.f16 (little-endian f16 rows [positions, 3h]),
index.jsonl ({"cid", "offset", "len", "prompt_len", "tokens"} per sequence), target.safetensors
(embed_tokens.weight, norm.weight) and config.json (the target's hyper-parameters).

Output OUTDIR: checkpoint.pt, train-log.jsonl, validation.json, token-frequencies.json and
head/ (model.safetensors, config.json, training.json).
"""

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Eagle3Head, HeadConfig, export_head, init_weights  # noqa: E402

STEP_WEIGHT = 0.8
VAL_DRAFTS = 4
MAX_DRAFT_VOCAB = 8192


def log(msg):
    print(f"train: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Arguments


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Train an EAGLE-3 draft head on dump-hidden output (CPU, float32).")
    p.add_argument("--data", action="append", required=True,
                   help="a dump-hidden output directory to train on (repeatable)")
    p.add_argument("--val", help="a dump-hidden output directory to validate on (held out)")
    p.add_argument("--out", required=True, help="output directory (checkpoint, logs, head/)")
    p.add_argument("--draft-vocab", type=int, default=MAX_DRAFT_VOCAB,
                   help=f"draft vocabulary size, at most {MAX_DRAFT_VOCAB} (default %(default)s)")
    p.add_argument("--ttt-steps", type=int, default=3, choices=[1, 2, 3, 4],
                   help="chained training-time-test steps per sequence (default %(default)s)")
    p.add_argument("--epochs", type=int, default=1,
                   help="passes over the data (default %(default)s)")
    p.add_argument("--lr", type=float, default=3e-4,
                   help="peak learning rate (default %(default)s)")
    p.add_argument("--min-lr-ratio", type=float, default=0.0,
                   help="cosine schedule's floor as a fraction of --lr (default %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="linear warm-up optimizer steps (default: 3%% of all steps, at most 200)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--tokens-per-step", type=int, default=8192,
                   help="token budget of one optimizer step; sequences are accumulated up to it "
                        "(default %(default)s)")
    p.add_argument("--max-len", type=int, default=2048,
                   help="longest sequence used; longer ones are cut (default %(default)s)")
    p.add_argument("--grad-clip", type=float, default=0.5, help="gradient norm clip")
    p.add_argument("--init-std", type=float, default=0.02, help="std of the layer weights' init")
    p.add_argument("--seed", type=int, default=0, help="init and batch order (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--checkpoint-every", type=int, default=100,
                   help="optimizer steps between checkpoints (default %(default)s)")
    p.add_argument("--log-every", type=int, default=10, help="optimizer steps between log lines")
    p.add_argument("--val-every", type=int, default=0,
                   help="also validate every N optimizer steps (0: only at epoch ends)")
    p.add_argument("--val-max-seqs", type=int, default=0,
                   help="validate on the first N sequences of --val only (0: all)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many optimizer steps in all (0: run every epoch); the "
                        "schedule still spans every epoch, so a later run continues it")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUTDIR/checkpoint.pt if there is one (default on)")
    p.add_argument("--export-only", action="store_true",
                   help="only export OUTDIR/head/ from OUTDIR/checkpoint.pt")
    p.add_argument("--export-dtype", choices=["bf16", "f32"], default="bf16",
                   help="dtype of the exported matrices and norms (default %(default)s)")
    args = p.parse_args(argv)
    if not 1 <= args.draft_vocab <= MAX_DRAFT_VOCAB:
        p.error(f"--draft-vocab must be in 1..{MAX_DRAFT_VOCAB}")
    if args.max_len < 3:
        p.error("--max-len must be at least 3")
    return args


# ---------------------------------------------------------------------------------------------
# Data


class DumpDir:
    """One dump-hidden output directory: its metadata, its sequences and their hidden rows."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        with open(os.path.join(path, "meta.json")) as f:
            self.meta = json.load(f)
        self.layers = [int(x) for x in self.meta["layers"]]
        self.hidden_size = int(self.meta["hidden_size"])
        if self.meta.get("dtype", "f16") != "f16":
            raise ValueError(f"{path}: hidden dtype {self.meta.get('dtype')}, expected f16")
        self.width = len(self.layers) * self.hidden_size
        index_path = os.path.join(path, "index.jsonl")
        with open(index_path, "rb") as f:
            raw = f.read()
        self.index_sha256 = hashlib.sha256(raw).hexdigest()
        self.seqs = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
        hidden_path = os.path.join(path, "hidden.f16")
        rows = os.path.getsize(hidden_path) // (2 * self.width)
        self.hidden = np.memmap(hidden_path, dtype="<f2", mode="r", shape=(rows, self.width))
        for s in self.seqs:
            if s["offset"] + s["len"] > rows or len(s["tokens"]) != s["len"]:
                raise ValueError(f"{path}: sequence {s['cid']} does not fit hidden.f16/its tokens")

    def sequence(self, i, max_len):
        """(tokens int64 [n], hidden rows f16 [n, 3h], prompt_len), cut to max_len."""
        s = self.seqs[i]
        n = min(s["len"], max_len)
        tokens = np.asarray(s["tokens"][:n], dtype=np.int64)
        return tokens, self.hidden[s["offset"]:s["offset"] + n], min(s["prompt_len"], n)

    def usable(self, i, max_len):
        """Whether sequence i has a position whose label is a response token."""
        s = self.seqs[i]
        n = min(s["len"], max_len)
        return n >= 3 and s["prompt_len"] < n

    def response_tokens(self, max_len):
        for s in self.seqs:
            n = min(s["len"], max_len)
            yield s["tokens"][s["prompt_len"]:n]


def load_target(path):
    """The target's config.json, embedding [vocab, h] and final norm [h] (float32), and its LM
    head if the file has one (SmolLM2 ties it to the embedding, so it usually does not)."""
    from safetensors import safe_open

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with safe_open(os.path.join(path, "target.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        embed = f.get_tensor("embed_tokens.weight").float()
        norm = f.get_tensor("norm.weight").float()
        lm_head = f.get_tensor("lm_head.weight").float() if "lm_head.weight" in keys else None
    return cfg, embed, norm, lm_head


def check_compatible(dirs):
    first = dirs[0]
    for d in dirs[1:]:
        for key in ("layers", "hidden_size", "vocab_size"):
            if d.meta.get(key) != first.meta.get(key):
                raise ValueError(f"{d.path}: {key} {d.meta.get(key)} differs from "
                                 f"{first.path}'s {first.meta.get(key)}")


def token_counts(dirs, vocab, max_len):
    counts = np.zeros(vocab, dtype=np.int64)
    for d in dirs:
        for toks in d.response_tokens(max_len):
            if toks:
                counts += np.bincount(np.asarray(toks, dtype=np.int64), minlength=vocab)
    return counts


def choose_draft_vocab(counts, size):
    """The `size` most frequent tokens (ties by lower id; unseen tokens by lower id fill up a
    small data set's vocabulary), ascending by id, and the least count taken."""
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count desc, then id asc
    chosen = order[:size]
    return np.sort(chosen), int(counts[chosen].min())


def frequency_table(counts, ids, cutoff):
    seen = np.nonzero(counts)[0]
    seen = seen[np.lexsort((seen, -counts[seen]))]
    total = int(counts.sum())
    return {
        "total_response_tokens": total,
        "distinct_response_tokens": int(len(seen)),
        "draft_vocab_size": int(len(ids)),
        "cutoff_count": cutoff,
        "coverage": float(counts[ids].sum() / max(total, 1)),
        "counts": [[int(t), int(counts[t])] for t in seen],
    }


class Example:
    """One sequence, ready for the head: row p reads token x_{p+1}'s embedding and the target's
    hidden states g_p and predicts x_{p+2}, for p = 0..n-3."""

    def __init__(self, tokens, hidden, prompt_len, embed, t2d_table):
        n = len(tokens)
        tok = torch.from_numpy(tokens)
        self.n = n
        self.tokens = tok
        self.embeds = embed[tok[1:n - 1]]
        self.hidden = torch.from_numpy(np.asarray(hidden[:n - 2], dtype=np.float32))
        self.labels = tok[2:]  # target ids
        self.draft_labels = t2d_table[self.labels]
        pos = torch.arange(n - 2)
        self.response = pos + 2 >= prompt_len
        self.valid0 = self.response & (self.draft_labels >= 0)
        self.response_tokens = n - prompt_len

    def valid(self, step):
        """Loss positions of TTT step `step`: response labels in the draft vocabulary, and p >=
        step (a chain that starts at or after position 0)."""
        if step == 0:
            return self.valid0
        return self.valid0 & (torch.arange(self.n - 2) >= step)


def step_losses(head, ex, steps):
    """Per step: the cross-entropy summed over its loss positions, positions and correct
    argmaxes; the logits are computed at loss positions only (the LM head dominates the cost)."""
    _, outs = head.forward_steps(ex.embeds, ex.hidden, steps, logits=False)
    sums, counts, correct = [], [], []
    for j, out in enumerate(outs):
        idx = torch.nonzero(ex.valid(j)).squeeze(1)
        logits = head.logits(out[idx])
        target = ex.draft_labels[idx]
        sums.append(F.cross_entropy(logits, target, reduction="sum"))
        counts.append(int(idx.numel()))
        correct.append(int((logits.argmax(-1) == target).sum()))
    return sums, counts, correct


# ---------------------------------------------------------------------------------------------
# Batches and schedule


def epoch_batches(items, lengths, seed, epoch, budget):
    """The epoch's optimizer steps: sequences in an order set by (seed, epoch), packed greedily
    into steps of at most `budget` tokens (a longer sequence takes a step of its own)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(items))
    batches, cur, used = [], [], 0
    for i in order:
        n = lengths[i]
        if cur and used + n > budget:
            batches.append(cur)
            cur, used = [], 0
        cur.append(int(i))
        used += n
    if cur:
        batches.append(cur)
    return batches


def lr_lambda(total, warmup, min_ratio):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(total - warmup, 1)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    return f


# ---------------------------------------------------------------------------------------------
# Validation


@torch.no_grad()
def validate(head, examples, k=VAL_DRAFTS):
    """Greedy chain drafting with K = k at every response start c (c + 2 >= prompt_len, all K
    labels inside the sequence): draft i is step i-1's argmax at position c+i-1, accepted iff it
    is x_{c+i+1} and drafts 1..i-1 were. Also the TTT loss and top-1 per step."""
    head.eval()
    to_target = head.d2t + torch.arange(head.cfg.draft_vocab_size)
    reached = np.zeros(k + 1, dtype=np.int64)  # reached[i]: starts with drafts 1..i accepted
    starts = 0
    loss_sum, loss_n, top1 = np.zeros(k), np.zeros(k), np.zeros(k)
    for ex in examples:
        logits, _ = head.forward_steps(ex.embeds, ex.hidden, k)
        T = ex.n - 2
        hits = []
        for j in range(k):
            pred = to_target[logits[j].argmax(-1)]
            hits.append(pred == ex.labels)
            idx = torch.nonzero(ex.valid(j)).squeeze(1)
            loss_sum[j] += float(F.cross_entropy(logits[j][idx], ex.draft_labels[idx],
                                                 reduction="sum")) if idx.numel() else 0.0
            loss_n[j] += idx.numel()
            top1[j] += int(hits[j][idx].sum())
        c = torch.arange(T - (k - 1))  # the last start needs position c + k - 1 <= T - 1
        c = c[ex.response[c]]
        starts += c.numel()
        ok = torch.ones(c.numel(), dtype=torch.bool)
        reached[0] += c.numel()
        for i in range(1, k + 1):
            ok &= hits[i - 1][c + i - 1]
            reached[i] += int(ok.sum())
    head.train()
    cond = [float(reached[i] / reached[i - 1]) if reached[i - 1] else 0.0 for i in range(1, k + 1)]
    uncond = [float(reached[i] / starts) if starts else 0.0 for i in range(1, k + 1)]
    return {
        "sequences": len(examples),
        "starts": int(starts),
        "accept_ratio_per_position": cond,
        "accept_rate_unconditional": uncond,
        "mean_accepted_length": 1.0 + sum(uncond),
        "loss_per_step": [float(s / max(n, 1)) for s, n in zip(loss_sum, loss_n)],
        "top1_per_step": [float(t / max(n, 1)) for t, n in zip(top1, loss_n)],
    }


def record_validation(out_dir, entry):
    """Appends to OUTDIR/validation.json, replacing an entry of the same step (a resumed run
    that validates again where it stopped)."""
    path = os.path.join(out_dir, "validation.json")
    entries = read_json(path, [])
    entries = [e for e in entries if e.get("step") != entry["step"]] + [entry]
    write_json(path, entries)
    return entries


# ---------------------------------------------------------------------------------------------
# Files


def read_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def write_json(path, obj):
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def plan_signature(args):
    """What a resumed run must share with the stopped one for the batch order to continue."""
    keep = {"data": [os.path.abspath(d) for d in args.data], "seed": args.seed,
            "epochs": args.epochs, "tokens_per_step": args.tokens_per_step,
            "max_len": args.max_len, "draft_vocab": args.draft_vocab,
            "ttt_steps": args.ttt_steps}
    return keep


def save_checkpoint(path, head, opt, sched, state):
    blob = {
        "model": head.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate()},
        **state,
    }
    tmp = path + ".partial"
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def manifest(dirs, max_len):
    return [{"dir": d.path, "sequences": len(d.seqs),
             "response_tokens": int(sum(len(t) for t in d.response_tokens(max_len))),
             "index_sha256": d.index_sha256} for d in dirs]


def export(args, head, out_dir, state, freq, final_validation):
    head_dir = os.path.join(out_dir, "head")
    export_head(head, head_dir, dtype=args.export_dtype)
    info = {
        "command": state.get("command"),
        "seed": args.seed,
        "args": {k: v for k, v in vars(args).items()},
        "step": state.get("step"),
        "epoch": state.get("epoch"),
        "data": state.get("manifest"),
        "validation_data": state.get("val_manifest"),
        "draft_vocab": {k: freq[k] for k in ("draft_vocab_size", "cutoff_count", "coverage",
                                             "total_response_tokens",
                                             "distinct_response_tokens")} if freq else None,
        "response_tokens_seen": state.get("response_tokens_seen"),
        "validation": final_validation,
    }
    write_json(os.path.join(head_dir, "training.json"), info)
    log(f"exported {head_dir} ({args.export_dtype})")


# ---------------------------------------------------------------------------------------------
# Training


def head_config(target_cfg, meta, draft_vocab):
    h = target_cfg["hidden_size"]
    return HeadConfig(
        hidden_size=h,
        intermediate_size=target_cfg["intermediate_size"],
        num_attention_heads=target_cfg["num_attention_heads"],
        num_key_value_heads=target_cfg.get("num_key_value_heads",
                                           target_cfg["num_attention_heads"]),
        head_dim=target_cfg.get("head_dim"),
        rms_norm_eps=target_cfg.get("rms_norm_eps", 1e-5),
        rope_theta=target_cfg.get("rope_theta", 10000.0),
        vocab_size=target_cfg["vocab_size"],
        draft_vocab_size=draft_vocab,
        aux_layer_ids=meta["layers"],
        target_hidden_size=h,
        max_position_embeddings=target_cfg.get("max_position_embeddings", 8192),
    )


class Trainer:
    """Holds the run: data, head, optimizer, schedule and the position in the plan."""

    def __init__(self, args, argv):
        self.args = args
        self.out = args.out
        os.makedirs(self.out, exist_ok=True)
        self.dirs = [DumpDir(d) for d in args.data]
        self.val_dir = DumpDir(args.val) if args.val else None
        check_compatible(self.dirs + ([self.val_dir] if self.val_dir else []))
        target_cfg, self.embed, final_norm, target_lm_head = load_target(args.data[0])
        if target_cfg["hidden_size"] != self.dirs[0].hidden_size:
            raise ValueError("config.json's hidden_size differs from meta.json's")
        vocab = target_cfg["vocab_size"]
        size = min(args.draft_vocab, vocab)
        counts = token_counts(self.dirs, vocab, args.max_len)
        ids, cutoff = choose_draft_vocab(counts, size)
        self.freq = frequency_table(counts, ids, cutoff)
        write_json(os.path.join(self.out, "token-frequencies.json"), self.freq)
        self.cfg = head_config(target_cfg, self.dirs[0].meta, size)

        torch.manual_seed(args.seed)
        self.head = Eagle3Head(self.cfg)
        source = target_lm_head if target_lm_head is not None else self.embed
        init_weights(self.head, args.init_std, lm_head=source[torch.from_numpy(ids)],
                     final_norm=final_norm)
        self.head.set_draft_vocab(torch.from_numpy(ids))
        self.t2d_table = self.head.target_to_draft_table()

        self.items = [(di, si) for di, d in enumerate(self.dirs) for si in range(len(d.seqs))
                      if d.usable(si, args.max_len)]
        self.lengths = [min(self.dirs[di].seqs[si]["len"], args.max_len) for di, si in self.items]
        self.plan = [epoch_batches(self.items, self.lengths, args.seed, e, args.tokens_per_step)
                     for e in range(args.epochs)]
        self.total_steps = sum(len(b) for b in self.plan)
        warmup = args.warmup_steps
        if warmup is None:
            warmup = min(200, max(1, int(0.03 * self.total_steps)))
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                     weight_decay=args.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lr_lambda(self.total_steps, warmup, args.min_lr_ratio))
        self.state = {
            "step": 0, "epoch": 0, "batch": 0, "response_tokens_seen": 0, "loss_tokens_seen": 0,
            "command": ["train.py"] + list(argv), "plan": plan_signature(args),
            "manifest": manifest(self.dirs, args.max_len),
            "val_manifest": manifest([self.val_dir], args.max_len) if self.val_dir else None,
            "config": self.cfg.__dict__,
        }
        self._val_examples = None

    # -- checkpoints -----------------------------------------------------------------------

    @property
    def ckpt_path(self):
        return os.path.join(self.out, "checkpoint.pt")

    def resume(self):
        if not os.path.exists(self.ckpt_path):
            return False
        blob = load_checkpoint(self.ckpt_path)
        if blob["plan"] != self.state["plan"]:
            raise SystemExit(f"train: {self.ckpt_path} is another run's ({blob['plan']}); "
                             "use the same arguments, --no-resume, or another --out")
        self.head.load_state_dict(blob["model"])
        self.opt.load_state_dict(blob["optimizer"])
        self.sched.load_state_dict(blob["scheduler"])
        torch.set_rng_state(blob["rng"]["torch"])
        np.random.set_state(blob["rng"]["numpy"])
        random.setstate(blob["rng"]["python"])
        for key in ("step", "epoch", "batch", "response_tokens_seen", "loss_tokens_seen"):
            self.state[key] = blob[key]
        if self.args.export_only:  # training.json names the training command, not this one
            self.state["command"] = blob.get("command", self.state["command"])
        log(f"resumed {self.ckpt_path}: step {blob['step']}, epoch {blob['epoch']}, "
            f"batch {blob['batch']}")
        return True

    def checkpoint(self):
        state = {k: v for k, v in self.state.items()}
        save_checkpoint(self.ckpt_path, self.head, self.opt, self.sched, state)

    # -- steps -----------------------------------------------------------------------------

    def example(self, dump, i):
        tokens, hidden, prompt_len = dump.sequence(i, self.args.max_len)
        return Example(tokens, hidden, prompt_len, self.embed, self.t2d_table)

    def train_step(self, batch):
        """One optimizer step over the batch's sequences, one forward each; each TTT step's
        loss is the mean over the batch's loss positions of that step."""
        steps = self.args.ttt_steps
        examples = [self.example(self.dirs[self.items[i][0]], self.items[i][1]) for i in batch]
        totals = [sum(int(ex.valid(j).sum()) for ex in examples) for j in range(steps)]
        self.opt.zero_grad(set_to_none=True)
        sums, correct = np.zeros(steps), np.zeros(steps)
        for ex in examples:
            losses, _, hits = step_losses(self.head, ex, steps)
            loss = sum(STEP_WEIGHT ** j * losses[j] / max(totals[j], 1) for j in range(steps))
            if loss.requires_grad:
                loss.backward()
            sums += [float(x.detach()) for x in losses]
            correct += hits
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.head.parameters(),
                                                         self.args.grad_clip))
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        self.state["step"] += 1
        self.state["response_tokens_seen"] += sum(ex.response_tokens for ex in examples)
        self.state["loss_tokens_seen"] += totals[0]
        return {
            "positions": sum(ex.n - 2 for ex in examples),
            "loss": [float(s / max(t, 1)) for s, t in zip(sums, totals)],
            "acc": [float(c / max(t, 1)) for c, t in zip(correct, totals)],
            "grad_norm": grad_norm, "lr": lr,
        }

    def val_examples(self):
        if self._val_examples is None:
            d, n = self.val_dir, len(self.val_dir.seqs)
            if self.args.val_max_seqs:
                n = min(n, self.args.val_max_seqs)
            self._val_examples = [self.example(d, i) for i in range(n)
                                  if d.usable(i, self.args.max_len)
                                  and min(d.seqs[i]["len"], self.args.max_len) >= VAL_DRAFTS + 2]
        return self._val_examples

    def run_validation(self):
        if not self.val_dir:
            return None
        started = time.time()
        entry = {"step": self.state["step"], "epoch": self.state["epoch"],
                 "response_tokens_seen": self.state["response_tokens_seen"],
                 "loss_tokens_seen": self.state["loss_tokens_seen"],
                 **validate(self.head, self.val_examples())}
        entry["seconds"] = round(time.time() - started, 1)
        record_validation(self.out, entry)
        acc = " ".join(f"{a:.3f}" for a in entry["accept_ratio_per_position"])
        log(f"validation at step {entry['step']}: accept by position {acc}, mean accepted "
            f"length {entry['mean_accepted_length']:.3f} ({entry['starts']} starts)")
        return entry

    # -- the loop --------------------------------------------------------------------------

    def train(self):
        args, st = self.args, self.state
        log_path = os.path.join(self.out, "train-log.jsonl")
        log(f"{len(self.items)} sequences, {self.total_steps} optimizer steps over "
            f"{args.epochs} epoch(s), draft vocab {self.cfg.draft_vocab_size} (cut-off count "
            f"{self.freq['cutoff_count']}, coverage {self.freq['coverage']:.3f})")
        window = {"positions": 0, "seconds": 0.0}  # training time only, not validation
        stopped = False
        while st["epoch"] < args.epochs and not stopped:
            batches = self.plan[st["epoch"]]
            while st["batch"] < len(batches):
                if args.max_steps and st["step"] >= args.max_steps:
                    stopped = True
                    break
                t0 = time.time()
                stats = self.train_step(batches[st["batch"]])
                st["batch"] += 1
                window["positions"] += stats["positions"]
                window["seconds"] += time.time() - t0
                if st["step"] % args.log_every == 0 or st["step"] == self.total_steps:
                    self._log_step(log_path, stats, window)
                if args.checkpoint_every and st["step"] % args.checkpoint_every == 0:
                    self.checkpoint()
                if args.val_every and st["step"] % args.val_every == 0:
                    self.run_validation()
            if stopped:
                break
            self.run_validation()
            st["epoch"] += 1
            st["batch"] = 0
            self.checkpoint()
            log(f"epoch {st['epoch']} of {args.epochs} done at step {st['step']}")
        if stopped:
            self.checkpoint()
            log(f"stopped at --max-steps {args.max_steps}")
        return stopped

    def _log_step(self, log_path, stats, window):
        rate = window["positions"] / max(window["seconds"], 1e-9)
        st = self.state
        rec = {"time": time.time(), "step": st["step"], "epoch": st["epoch"],
               "batch": st["batch"], "lr": stats["lr"], "loss": stats["loss"],
               "acc": stats["acc"], "grad_norm": stats["grad_norm"], "tokens_per_s": rate,
               "response_tokens_seen": st["response_tokens_seen"]}
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        loss = " ".join(f"{x:.3f}" for x in stats["loss"])
        acc = " ".join(f"{x:.3f}" for x in stats["acc"])
        log(f"step {st['step']}/{self.total_steps} epoch {st['epoch']} lr {stats['lr']:.2e} "
            f"loss {loss} acc {acc} |g| {stats['grad_norm']:.2f} {rate:.0f} tok/s")
        window["positions"], window["seconds"] = 0, 0.0

    def finish(self):
        """Final validation (unless the last one was at this step) and the export."""
        entries = read_json(os.path.join(self.out, "validation.json"), [])
        final = next((e for e in entries if e.get("step") == self.state["step"]), None)
        if final is None and self.val_dir:
            final = self.run_validation()
        export(self.args, self.head, self.out, self.state, self.freq, final)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    trainer = Trainer(args, argv)
    resumed = args.resume and trainer.resume()
    if args.export_only:
        if not resumed:
            raise SystemExit(f"train: --export-only needs {trainer.ckpt_path}")
        entries = read_json(os.path.join(args.out, "validation.json"), [])
        final = next((e for e in entries if e.get("step") == trainer.state["step"]), None)
        export(args, trainer.head, args.out, trainer.state, trainer.freq, final)
        return trainer
    trainer.train()
    trainer.finish()
    return trainer


if __name__ == "__main__":
    main()
