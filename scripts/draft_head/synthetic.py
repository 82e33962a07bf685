#!/usr/bin/env python3
"""A synthetic dump-hidden directory, for testing and timing train.py without a target model.

    python3 scripts/draft_head/synthetic.py OUTDIR [--hidden 576 --heads 9 ...]

Same files as the engine's `dump-hidden` writes (meta.json, hidden.f16, index.jsonl) plus the
target's target.safetensors (embed_tokens.weight, norm.weight) and config.json. The "target"
is a Markov chain, x_{t+1} = perm[x_t] most of the time, and its hidden state g_p is a fixed
random projection of x_p's embedding plus noise: enough structure for a head to learn, so a
falling loss means training works. Seeded: the same arguments give the same bytes.
"""

import argparse
import json
import os

import numpy as np


def write_dump(out, *, sequences=32, seq_len=64, prompt_len=8, hidden=32, intermediate=64,
               heads=4, kv_heads=2, head_dim=None, vocab=64, layers=(1, 2, 3), noise=0.1,
               seed=0, target_seed=0, num_layers=6):
    """Writes a dump directory; returns its path. The "target" (chain, embedding, hidden
    projection) comes from `target_seed` alone, the sequences from `seed`: dumps with different
    seeds are different data from the same target, as training and validation sets are."""
    from safetensors.numpy import save_file

    trng = np.random.default_rng(target_seed)
    perm = trng.permutation(vocab)
    embed = trng.normal(0, 0.1, (vocab, hidden)).astype(np.float32)
    proj = trng.normal(0, 10 / np.sqrt(hidden), (hidden, len(layers) * hidden)).astype(np.float32)
    rng = np.random.default_rng([target_seed, seed])
    os.makedirs(out, exist_ok=True)
    meta = {"model": "synthetic", "layers": list(layers), "hidden_size": hidden,
            "num_layers": num_layers, "vocab_size": vocab, "dtype": "f16"}
    config = {"hidden_size": hidden, "intermediate_size": intermediate,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim or hidden // heads, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "vocab_size": vocab, "num_hidden_layers": num_layers,
              "max_position_embeddings": 8192}
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({"embed_tokens.weight": embed.astype(np.float16),
               "norm.weight": np.ones(hidden, dtype=np.float32)},
              os.path.join(out, "target.safetensors"))
    offset = 0
    with open(os.path.join(out, "hidden.f16"), "wb") as hf, \
            open(os.path.join(out, "index.jsonl"), "w") as idx:
        for s in range(sequences):
            tokens = [int(rng.integers(vocab))]
            for _ in range(seq_len - 1):
                nxt = perm[tokens[-1]] if rng.random() > noise else rng.integers(vocab)
                tokens.append(int(nxt))
            g = embed[tokens] @ proj + rng.normal(0, 0.1, (seq_len, proj.shape[1]))
            hf.write(g.astype("<f2").tobytes())
            idx.write(json.dumps({"cid": f"syn-{seed}-{s}", "offset": offset, "len": seq_len,
                                  "prompt_len": prompt_len, "tokens": tokens}) + "\n")
            offset += seq_len
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="Write a synthetic dump-hidden directory.")
    p.add_argument("out", help="output directory")
    p.add_argument("--sequences", type=int, default=32, help="number of sequences")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    p.add_argument("--prompt-len", type=int, default=8, help="prompt tokens per sequence")
    p.add_argument("--hidden", type=int, default=32, help="hidden size")
    p.add_argument("--intermediate", type=int, default=64, help="MLP size")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    p.add_argument("--head-dim", type=int, default=None, help="head dim (default hidden/heads)")
    p.add_argument("--vocab", type=int, default=64, help="target vocabulary size")
    p.add_argument("--seed", type=int, default=0, help="seed of the sequences")
    p.add_argument("--target-seed", type=int, default=0, help="seed of the synthetic target")
    a = p.parse_args(argv)
    write_dump(a.out, sequences=a.sequences, seq_len=a.seq_len, prompt_len=a.prompt_len,
               hidden=a.hidden, intermediate=a.intermediate, heads=a.heads, kv_heads=a.kv_heads,
               head_dim=a.head_dim, vocab=a.vocab, seed=a.seed,
               target_seed=a.target_seed)


if __name__ == "__main__":
    main()
