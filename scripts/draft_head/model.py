"""The EAGLE-3 draft head (Li et al. 2025, https://arxiv.org/abs/2503.01840) as a torch module,
with the math the Rust engine implements, so that a head trained here drafts the same tokens
there (scripts/draft_head/fixture.py writes the numbers the engine's test compares against).

What the head is: one Llama decoder layer whose attention reads 2h features, the target's token
embedding (normalized) beside a hidden state (normalized), then a final norm and an LM head over
a reduced "draft" vocabulary. Its hidden input at the first step is fc(g): the target's hidden
states at three layers, concatenated; at later steps it is the head's own previous output.

Parameter names are the published EAGLE-3 checkpoints' (as vLLM and SGLang load them):
fc.weight, midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight, norm.weight,
lm_head.weight, and the buffers d2t (target id = draft id + d2t[draft id]) and t2d (which target
ids are in the draft vocabulary). The token embedding is the target's, frozen and passed in.

Two ways to run it, which must agree (test_model.py checks that they do):
  * `forward_steps`: training-time test (TTT), every position of a sequence at once for S
    chained steps, with the attention pattern serving produces;
  * `HeadCache` + `extend`: serving's incremental form, a KV cache that entries are appended to.
"""

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass
class HeadConfig:
    """The head's hyper-parameters; the layer's shape is the target's own layer shape."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    aux_layer_ids: List[int] = field(default_factory=lambda: [2, 15, 27])
    head_dim: Optional[int] = None  # default hidden_size / num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    target_hidden_size: Optional[int] = None  # default hidden_size
    max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if len(self.aux_layer_ids) != 3:
            raise ValueError("EAGLE-3 reads three target layers")
        self.aux_layer_ids = [int(i) for i in self.aux_layer_ids]


def hf_config(cfg: HeadConfig, torch_dtype: str) -> dict:
    """The Hugging Face config.json of an exported head, in the published EAGLE-3 layout."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
            "use_aux_hidden_state": True,
        },
    }


def config_from_hf(d: dict) -> HeadConfig:
    """Reads an exported config.json back (the inverse of `hf_config`)."""
    eagle = d.get("eagle_config") or {}
    return HeadConfig(
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
        vocab_size=d["vocab_size"],
        draft_vocab_size=d.get("draft_vocab_size", d["vocab_size"]),
        aux_layer_ids=eagle.get("eagle_aux_hidden_state_layer_ids", [2, 15, 27]),
        head_dim=d.get("head_dim"),
        rms_norm_eps=d.get("rms_norm_eps", 1e-5),
        rope_theta=d.get("rope_theta", 10000.0),
        target_hidden_size=d.get("target_hidden_size"),
        max_position_embeddings=d.get("max_position_embeddings", 8192),
    )


# ---------------------------------------------------------------------------------------------
# Building blocks


def rms_norm(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * w, in float32 whatever x's dtype."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions, head_dim, theta):
    """cos and sin [T, head_dim] of Hugging Face's rotary embedding: pair (i, i + hd/2) turns by
    position * theta^(-2i/hd). The angles are computed in float64, then rounded once."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """x [T, heads, hd] rotated with Hugging Face's rotate_half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    """The projections of the head's attention; the attention pattern is the caller's."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = hd
        self.q_proj = nn.Linear(2 * h, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=False)


class MLP(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)


# ---------------------------------------------------------------------------------------------
# Attention patterns


def _expand_kv(x, heads):
    """[N, kv_heads, hd] -> [N, heads, hd]: query head i reads kv head i // (heads / kv_heads)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def ttt_attention(q, k0, v0, diag_k, diag_v, step):
    """Attention of step `step`'s queries at every position p at once.

    q [T, H, hd]; k0, v0 [T, H, hd] step 0's keys and values; diag_k, diag_v: lists of step
    i = 1..step's keys and values [T, H, hd] (kv heads already expanded). Query p attends to
    step 0 at positions 0..p-step and to step i at position p-step+i for i = 1..step (i = step:
    itself): after the target verified up to c = p - step, serving's cache holds step 0 up to c
    and draft i's entry at c + i. Entries before position 0 are masked out.
    """
    T, H, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    qh = q.transpose(0, 1)  # [H, T, hd]
    scores = torch.matmul(qh, k0.permute(1, 2, 0)) * scale  # [H, T, T]
    pos = torch.arange(T)
    allowed = pos[None, :] <= (pos[:, None] - step)  # key <= p - step
    scores = scores.masked_fill(~allowed, float("-inf"))
    parts = [scores]
    shifted_v = []
    for i in range(1, step + 1):
        shift = step - i  # key position p - shift
        k_i = _shift_rows(diag_k[i - 1], shift)
        v_i = _shift_rows(diag_v[i - 1], shift)
        d = (q * k_i).sum(-1).transpose(0, 1) * scale  # [H, T]
        if shift:
            d = d.masked_fill((pos < shift)[None, :], float("-inf"))
        parts.append(d.unsqueeze(-1))
        shifted_v.append(v_i)
    probs = torch.softmax(torch.cat(parts, dim=-1), dim=-1)  # [H, T, T + step]
    out = torch.matmul(probs[..., :T], v0.transpose(0, 1))  # [H, T, hd]
    for i, v_i in enumerate(shifted_v):
        out = out + probs[..., T + i].unsqueeze(-1) * v_i.transpose(0, 1)
    return out.transpose(0, 1).reshape(T, H * hd)


def _shift_rows(x, shift):
    """Row p of the result is row p - shift of x (zeros before the start)."""
    if shift == 0:
        return x
    return torch.cat([x.new_zeros((shift,) + x.shape[1:]), x[:-shift]], dim=0)


class HeadCache:
    """Serving's KV cache of the head: one (key, value) entry per call row, in append order,
    keys already rotated at their own positions. `truncate` drops rejected drafts' entries."""

    def __init__(self):
        self.k = None  # [N, kv_heads, hd]
        self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.shape[0]

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=0)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=0)

    def truncate(self, n):
        if self.k is not None:
            self.k, self.v = self.k[:n], self.v[:n]


# ---------------------------------------------------------------------------------------------
# The head


class Eagle3Head(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(3 * cfg.target_hidden_size, h, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # -- vocabulary ------------------------------------------------------------------------

    def set_draft_vocab(self, target_ids):
        """Draft id i is target id target_ids[i] (ascending)."""
        ids = torch.as_tensor(target_ids, dtype=torch.int64)
        if ids.numel() != self.cfg.draft_vocab_size:
            raise ValueError(f"{ids.numel()} draft ids for draft_vocab_size "
                             f"{self.cfg.draft_vocab_size}")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("draft vocabulary must be ascending target ids")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]

    def target_to_draft_table(self):
        """[vocab] draft id of each target id, -1 where it has none."""
        table = torch.full((self.cfg.vocab_size,), -1, dtype=torch.int64)
        ids = self.draft_to_target(torch.arange(self.cfg.draft_vocab_size))
        table[ids] = torch.arange(self.cfg.draft_vocab_size)
        return table

    # -- pieces of one step ----------------------------------------------------------------

    def _qkv(self, embeds, f, positions):
        """Per position: the residual, q [T, H, hd], k and v [T, KV, hd], rotated."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        a = layer.input_layernorm(embeds)
        b = layer.hidden_norm(f)
        z = torch.cat([a, b], dim=-1)
        T = z.shape[0]
        q = attn.q_proj(z).view(T, attn.heads, attn.head_dim)
        k = attn.k_proj(z).view(T, attn.kv_heads, attn.head_dim)
        v = attn.v_proj(z).view(T, attn.kv_heads, attn.head_dim)
        cos, sin = rope_cos_sin(positions, attn.head_dim, self.cfg.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _finish(self, residual, attn_out):
        """o_proj, residual, MLP: the step's prenorm output."""
        layer = self.midlayer
        r = residual + layer.self_attn.o_proj(attn_out)
        return r + layer.mlp(layer.post_attention_layernorm(r))

    def logits(self, out):
        """Draft-vocabulary logits of prenorm outputs."""
        return self.lm_head(self.norm(out))

    def project(self, target_hidden):
        """fc: the target's three hidden states [T, 3h] -> the first step's input [T, h]."""
        return self.fc(target_hidden.float())

    # -- training-time test ----------------------------------------------------------------

    def forward_steps(self, embeds, target_hidden, steps, logits=True):
        """S chained steps over a whole sequence (TTT).

        embeds [T, h]: row p the embedding of token x_{p+1}; target_hidden [T, 3h]: row p the
        target's captured states g_p. Step 0 at p reads (e_p, fc(g_p)); step j >= 1 at p reads
        (e_p, out^{j-1}_{p-1}) (zeros at p = 0); every step at p predicts x_{p+2}. Step j at
        p < j has no serving counterpart (its chain starts before the sequence): mask its loss.

        Returns (logits, outs): lists of `steps` tensors [T, draft_vocab] (None unless
        `logits`) and [T, h] (the prenorm outputs).
        """
        T = embeds.shape[0]
        heads = self.midlayer.self_attn.heads
        positions = torch.arange(T)
        f = self.project(target_hidden)
        all_logits, outs = [], []
        k0 = v0 = None
        diag_k, diag_v = [], []
        for step in range(steps):
            if step > 0:
                f = _shift_rows(outs[-1], 1)
            q, k, v = self._qkv(embeds, f, positions)
            k, v = _expand_kv(k, heads), _expand_kv(v, heads)
            if step == 0:
                k0, v0 = k, v
            else:
                diag_k.append(k)
                diag_v.append(v)
            attn = ttt_attention(q, k0, v0, diag_k, diag_v, step)
            out = self._finish(f, attn)
            outs.append(out)
            all_logits.append(self.logits(out) if logits else None)
        return all_logits, outs

    def forward(self, embeds, target_hidden, steps=3):
        return self.forward_steps(embeds, target_hidden, steps)

    # -- serving's incremental form ----------------------------------------------------------

    def extend(self, cache: HeadCache, embeds, f, positions):
        """Appends rows to `cache` and returns (logits, out) for them, as serving runs the head:
        row i attends to every entry already in the cache and to rows 0..i of this call.

        The catch-up over verified positions is one call with f = fc(g); a draft step is one
        row with f the previous step's out and the previous draft's token embedding."""
        attn = self.midlayer.self_attn
        positions = torch.as_tensor(positions, dtype=torch.int64)
        q, k, v = self._qkv(embeds, f, positions)
        before = len(cache)
        cache.append(k, v)
        keys, values = _expand_kv(cache.k, attn.heads), _expand_kv(cache.v, attn.heads)
        n, T = keys.shape[0], q.shape[0]
        scores = torch.einsum("thd,nhd->htn", q, keys) / math.sqrt(attn.head_dim)
        allowed = torch.arange(n)[None, :] <= before + torch.arange(T)[:, None]
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        o = torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), values)
        out = self._finish(f, o.reshape(T, -1))
        return self.logits(out), out


# ---------------------------------------------------------------------------------------------
# Initialization, export and loading


def init_weights(head: Eagle3Head, std=0.02, lm_head=None, final_norm=None):
    """Layer matrices normal(0, std), norms 1; lm_head and the final norm from the target's
    (embedding rows of the draft vocabulary for a tied target, and its final norm) if given."""
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
        if lm_head is not None:
            head.lm_head.weight.copy_(lm_head)
        if final_norm is not None:
            head.norm.weight.copy_(final_norm)


_DTYPES = {"bf16": (torch.bfloat16, "bfloat16"), "f32": (torch.float32, "float32"),
           "f16": (torch.float16, "float16")}


def export_head(head: Eagle3Head, out_dir, dtype="bf16", embed_tokens=None):
    """Writes out_dir/model.safetensors (matrices and norms in `dtype`, d2t int64, t2d bool, and
    embed_tokens.weight if given, for fixtures) and out_dir/config.json."""
    from safetensors.torch import save_file

    torch_dtype, name = _DTYPES[dtype]
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for key, p in head.state_dict().items():
        if key in ("d2t", "t2d"):
            tensors[key] = p.detach().clone().contiguous()
        else:
            tensors[key] = p.detach().to(torch_dtype).contiguous()
    if embed_tokens is not None:
        tensors["embed_tokens.weight"] = embed_tokens.detach().to(torch_dtype).contiguous()
    tmp = os.path.join(out_dir, "model.safetensors.partial")
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(head.cfg, name), f, indent=2)
        f.write("\n")


def load_head(head_dir):
    """(head in float32, embed_tokens.weight or None) from an exported directory."""
    from safetensors.torch import load_file

    with open(os.path.join(head_dir, "config.json")) as f:
        cfg = config_from_hf(json.load(f))
    tensors = load_file(os.path.join(head_dir, "model.safetensors"))
    embed = tensors.pop("embed_tokens.weight", None)
    head = Eagle3Head(cfg)
    state = {k: (v if k in ("d2t", "t2d") else v.float()) for k, v in tensors.items()}
    head.load_state_dict(state, strict=True)
    return head, (None if embed is None else embed.float())


def config_dict(cfg: HeadConfig) -> dict:
    return asdict(cfg)
