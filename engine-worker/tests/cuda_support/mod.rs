//! Support for the GPU tests: the skip-or-require gate and a plain f32 host reference of the
//! Llama forward (full causal attention recomputed from scratch, no cache), to check the CUDA
//! backend's paged, batched forward against.
#![allow(dead_code)]

use engine_worker::backend::cuda::device_count;
use engine_worker::model::{Model, ModelConfig, RopeStyle};

/// The device the GPU tests run on (`SPECULA_CUDA_DEVICE`, default 0), or `None` after printing
/// why the test is skipped. With `SPECULA_REQUIRE_GPU=1` (set by scripts/gpu-check.sh) a
/// missing GPU is a failure instead.
pub fn gpu_or_skip(test: &str) -> Option<usize> {
    let ordinal: usize = std::env::var("SPECULA_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let why = match device_count() {
        Ok(n) if n > ordinal => return Some(ordinal),
        Ok(n) => format!("{n} CUDA device(s), cuda:{ordinal} wanted"),
        Err(e) => e.to_string(),
    };
    if std::env::var("SPECULA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: GPU required (SPECULA_REQUIRE_GPU=1) but unavailable: {why}");
    }
    eprintln!("SKIPPED {test}: no usable CUDA GPU ({why})");
    None
}

/// A Llama shape small enough for a host reference but with every feature: GQA 8:2, two
/// layers, head_dim 64 (two lanes per warp in the attention kernel), untied lm_head.
pub fn small_llama(rope_style: RopeStyle) -> ModelConfig {
    let mut c = ModelConfig::tiny();
    c.name = "small-llama".into();
    c.vocab_size = 512;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.num_layers = 2;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.rope_style = rope_style;
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 4096;
    c
}

struct RefLayer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// The model's weights as f32, for the reference.
pub struct Reference {
    config: ModelConfig,
    embed: Vec<f32>,
    lm_head: Vec<f32>,
    final_norm: Vec<f32>,
    layers: Vec<RefLayer>,
}

/// `y[out] = w[out, in] · x[in]`.
fn matvec(w: &[f32], x: &[f32], out: usize) -> Vec<f32> {
    let cols = x.len();
    (0..out)
        .map(|r| {
            w[r * cols..(r + 1) * cols]
                .iter()
                .zip(x)
                .map(|(a, b)| a * b)
                .sum()
        })
        .collect()
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

fn rope(x: &mut [f32], pos: usize, c: &ModelConfig) {
    let d = c.head_dim;
    for head in x.chunks_exact_mut(d) {
        for i in 0..d / 2 {
            let freq = (c.rope_theta as f64).powf(-2.0 * i as f64 / d as f64);
            let (s, co) = ((pos as f64) * freq).sin_cos();
            let (a, b) = match c.rope_style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::HalfSplit => (i, i + d / 2),
            };
            let (x0, x1) = (head[a] as f64, head[b] as f64);
            head[a] = (x0 * co - x1 * s) as f32;
            head[b] = (x0 * s + x1 * co) as f32;
        }
    }
}

impl Reference {
    pub fn new(model: &Model) -> Self {
        let w = &model.weights;
        Self {
            config: model.config.clone(),
            embed: w.embed.to_f32(),
            lm_head: w.lm_head.to_f32(),
            final_norm: w.final_norm.clone(),
            layers: w
                .layers
                .iter()
                .map(|l| RefLayer {
                    attn_norm: l.attn_norm.clone(),
                    wq: l.wq.to_f32(),
                    wk: l.wk.to_f32(),
                    wv: l.wv.to_f32(),
                    wo: l.wo.to_f32(),
                    bq: l.bq.clone(),
                    bk: l.bk.clone(),
                    bv: l.bv.clone(),
                    ffn_norm: l.ffn_norm.clone(),
                    gate: l.w_gate.to_f32(),
                    up: l.w_up.to_f32(),
                    down: l.w_down.to_f32(),
                })
                .collect(),
        }
    }

    /// Logits after every position of `tokens` (the sequence from position 0).
    pub fn logits(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let (h, qd, kvd, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let group = c.num_heads / c.num_kv_heads;
        let mut xs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| self.embed[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect();
        for l in &self.layers {
            let mut keys = Vec::new();
            let mut values = Vec::new();
            let mut queries = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let n = rmsnorm(x, &l.attn_norm, c.rms_norm_eps);
                let add = |mut v: Vec<f32>, b: &Option<Vec<f32>>| {
                    if let Some(b) = b {
                        v.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                    }
                    v
                };
                let mut q = add(matvec(&l.wq, &n, qd), &l.bq);
                let mut k = add(matvec(&l.wk, &n, kvd), &l.bk);
                let v = add(matvec(&l.wv, &n, kvd), &l.bv);
                rope(&mut q, pos, c);
                rope(&mut k, pos, c);
                queries.push(q);
                keys.push(k);
                values.push(v);
            }
            for (pos, x) in xs.iter_mut().enumerate() {
                let mut attn = vec![0f32; qd];
                for head in 0..c.num_heads {
                    let kvh = head / group;
                    let d = c.head_dim;
                    let q = &queries[pos][head * d..(head + 1) * d];
                    let scores: Vec<f32> = (0..=pos)
                        .map(|p| {
                            let k = &keys[p][kvh * d..(kvh + 1) * d];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (d as f32).sqrt()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f32 = exps.iter().sum();
                    for (p, e) in exps.iter().enumerate() {
                        let v = &values[p][kvh * d..(kvh + 1) * d];
                        for i in 0..d {
                            attn[head * d + i] += e / sum * v[i];
                        }
                    }
                }
                let o = matvec(&l.wo, &attn, h);
                x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
                let n = rmsnorm(x, &l.ffn_norm, c.rms_norm_eps);
                let g = matvec(&l.gate, &n, ff);
                let u = matvec(&l.up, &n, ff);
                let act: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let down = matvec(&l.down, &act, h);
                x.iter_mut().zip(&down).for_each(|(x, d)| *x += d);
            }
        }
        xs.iter()
            .map(|x| {
                matvec(
                    &self.lm_head,
                    &rmsnorm(x, &self.final_norm, c.rms_norm_eps),
                    c.vocab_size,
                )
            })
            .collect()
    }
}

/// Asserts two logit rows agree within bf16 tolerance: every element within 4% of the row's
/// largest magnitude (bf16 rounds activations to 8 bits of mantissa before each GEMM), and the
/// same argmax whenever the reference's top two are clearly apart.
pub fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
    let tol = 0.04 * scale;
    let (worst, diff) = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0, 0f32),
            |acc, (i, d)| if d > acc.1 { (i, d) } else { acc },
        );
    assert!(
        diff <= tol && got.iter().all(|v| v.is_finite()),
        "{what}: max |diff| {diff} at {worst} above {tol} (got {}, want {})",
        got[worst],
        want[worst]
    );
    let argmax = |v: &[f32]| {
        v.iter().enumerate().fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
    };
    let (top, top_v) = argmax(want);
    let second = want
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != top)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    if top_v - second > 2.0 * tol {
        assert_eq!(
            argmax(got).0,
            top,
            "{what}: argmax differs with a clear reference winner"
        );
    }
}
