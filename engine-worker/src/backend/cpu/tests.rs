//! Backend tests on small dummy models: a dense f64 reference forward, prefill/decode/verify
//! consistency, batch invariance and input validation.

use super::*;
use crate::backend::LogitsFor;
use crate::model::{RopeStyle, WeightType};

fn tiny(dtype: WeightType, style: RopeStyle, bias: bool) -> Model {
    let mut config = ModelConfig::tiny();
    config.rope_style = style;
    config.attention_bias = bias;
    Model::dummy(config, dtype, 11).unwrap()
}

fn backend(model: Model, num_blocks: usize) -> CpuBackend {
    CpuBackend::new(model, CpuBackendOptions::new(num_blocks)).unwrap()
}

/// A plain dense forward of one sequence in f64, every position's logits.
fn reference_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f64>> {
    let c = &model.config;
    let w = &model.weights;
    let dense = |m: &crate::model::WeightMatrix| -> Vec<f64> {
        m.to_f32().into_iter().map(f64::from).collect()
    };
    let matvec = |m: &[f64], rows: usize, x: &[f64]| -> Vec<f64> {
        let cols = x.len();
        (0..rows)
            .map(|r| (0..cols).map(|i| m[r * cols + i] * x[i]).sum())
            .collect()
    };
    let norm = |x: &[f64], wt: &[f32]| -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + f64::from(c.rms_norm_eps)).sqrt();
        x.iter()
            .zip(wt)
            .map(|(v, w)| v * s * f64::from(*w))
            .collect()
    };
    let rope = |x: &mut [f64], pos: usize| {
        let hd = c.head_dim;
        for head in x.chunks_exact_mut(hd) {
            for i in 0..hd / 2 {
                let theta =
                    pos as f64 * f64::from(c.rope_theta).powf(-(2.0 * i as f64) / hd as f64);
                let (a_i, b_i) = match c.rope_style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::HalfSplit => (i, i + hd / 2),
                };
                let (a, b) = (head[a_i], head[b_i]);
                head[a_i] = a * theta.cos() - b * theta.sin();
                head[b_i] = a * theta.sin() + b * theta.cos();
            }
        }
    };
    let embed = dense(&w.embed);
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embed[t as usize * c.hidden_size..(t as usize + 1) * c.hidden_size].to_vec())
        .collect();
    for layer in &w.layers {
        let (wq, wk, wv, wo) = (
            dense(&layer.wq),
            dense(&layer.wk),
            dense(&layer.wv),
            dense(&layer.wo),
        );
        let add_bias = |mut v: Vec<f64>, b: &Option<Vec<f32>>| {
            if let Some(b) = b {
                v.iter_mut().zip(b).for_each(|(x, b)| *x += f64::from(*b));
            }
            v
        };
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let h = norm(x, &layer.attn_norm);
            let mut q = add_bias(matvec(&wq, c.q_dim(), &h), &layer.bq);
            let mut k = add_bias(matvec(&wk, c.kv_dim(), &h), &layer.bk);
            rope(&mut q, pos);
            rope(&mut k, pos);
            qs.push(q);
            ks.push(k);
            vs.push(add_bias(matvec(&wv, c.kv_dim(), &h), &layer.bv));
        }
        let group = c.num_heads / c.num_kv_heads;
        for (pos, x) in xs.iter_mut().enumerate() {
            let mut attn = vec![0.0; c.q_dim()];
            for h in 0..c.num_heads {
                let hd = c.head_dim;
                let kh = h / group;
                let q = &qs[pos][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let k = &ks[j][kh * hd..(kh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    for d in 0..hd {
                        attn[h * hd + d] += ej / total * vs[j][kh * hd + d];
                    }
                }
            }
            let o = matvec(&wo, c.hidden_size, &attn);
            x.iter_mut().zip(o).for_each(|(a, b)| *a += b);
            let h = norm(x, &layer.ffn_norm);
            let g = matvec(&dense(&layer.w_gate), c.intermediate_size, &h);
            let u = matvec(&dense(&layer.w_up), c.intermediate_size, &h);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = matvec(&dense(&layer.w_down), c.hidden_size, &act);
            x.iter_mut().zip(d).for_each(|(a, b)| *a += b);
        }
    }
    let head = dense(&w.lm_head);
    xs.iter()
        .map(|x| matvec(&head, c.vocab_size, &norm(x, &w.final_norm)))
        .collect()
}

fn run(b: &mut CpuBackend, tokens: &[u32], start: usize, table: &[u32], all: bool) -> Vec<f32> {
    b.forward(&[SeqForward {
        tokens,
        start_pos: start,
        block_table: table,
        logits: if all { LogitsFor::All } else { LogitsFor::Last },
    }])
    .unwrap()
}

const PROMPT: [u32; 21] = [
    1, 17, 99, 3, 250, 42, 42, 7, 8, 200, 13, 5, 77, 120, 64, 33, 2, 9, 10, 11, 12,
];

#[test]
fn matches_a_dense_reference_for_every_layout() {
    for (dtype, style, bias) in [
        (WeightType::Q4_1, RopeStyle::Interleaved, false),
        (WeightType::Q8_0, RopeStyle::HalfSplit, true),
        (WeightType::F16, RopeStyle::Interleaved, true),
        (WeightType::BF16, RopeStyle::HalfSplit, false),
        (WeightType::Q4_0, RopeStyle::Interleaved, false),
    ] {
        let model = tiny(dtype, style, bias);
        let want = reference_logits(&model, &PROMPT);
        for isa in Isa::testable(&Isa::ALL, "backend::cpu::tests (tiny models)") {
            let mut options = CpuBackendOptions::new(8);
            options.isa = Some(isa);
            let mut b = CpuBackend::new(model.clone(), options).unwrap();
            let got = run(&mut b, &PROMPT, 0, &[3, 1, 6], true);
            let vocab = model.config.vocab_size;
            for (p, row) in want.iter().enumerate() {
                for (i, w) in row.iter().enumerate() {
                    let g = f64::from(got[p * vocab + i]);
                    assert!(
                        (g - w).abs() < 1e-3,
                        "{dtype} {style:?} {isa:?} pos {p} id {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn prefill_decode_and_verify_chunks_agree() {
    let model = tiny(WeightType::Q4_1, RopeStyle::Interleaved, false);
    let vocab = model.config.vocab_size;
    let table = [5u32, 0, 2];
    let mut b = backend(model, 8);
    let full = run(&mut b, &PROMPT, 0, &table, true);

    // Token by token.
    let mut b2 = backend(b.model().clone(), 8);
    for (p, tok) in PROMPT.iter().enumerate() {
        let got = run(&mut b2, &[*tok], p, &table, false);
        for (g, f) in got.iter().zip(&full[p * vocab..(p + 1) * vocab]) {
            assert!((g - f).abs() < 1e-4, "decode pos {p}");
        }
    }

    // A prefill chunk, then K+1 verify chunks.
    let mut b3 = backend(b.model().clone(), 8);
    run(&mut b3, &PROMPT[..6], 0, &table, false);
    let mut pos = 6;
    for chunk in PROMPT[6..].chunks(5) {
        let got = run(&mut b3, chunk, pos, &table, true);
        for (i, row) in got.chunks_exact(vocab).enumerate() {
            let f = &full[(pos + i) * vocab..(pos + i + 1) * vocab];
            assert!(
                row.iter().zip(f).all(|(g, f)| (g - f).abs() < 1e-4),
                "verify pos {}",
                pos + i
            );
        }
        pos += chunk.len();
    }
}

#[test]
fn a_sequences_logits_do_not_depend_on_its_batch() {
    let model = tiny(WeightType::Q4_1, RopeStyle::Interleaved, false);
    let vocab = model.config.vocab_size;
    let mut alone = backend(model.clone(), 64);
    let mut crowd = backend(model, 64);
    let target: Vec<u32> = PROMPT.to_vec();
    let target_table = [60u32, 61];
    let others: Vec<(Vec<u32>, Vec<u32>)> = (0..7u32)
        .map(|i| {
            let len = 3 + 5 * i as usize;
            let toks = (0..len as u32).map(|j| (j * 31 + i * 7) % 256).collect();
            (toks, vec![i * 8, i * 8 + 1, i * 8 + 2])
        })
        .collect();

    let want_prefill = run(&mut alone, &target[..16], 0, &target_table, true);
    let mut batch: Vec<SeqForward<'_>> = others
        .iter()
        .map(|(t, table)| SeqForward {
            tokens: t,
            start_pos: 0,
            block_table: table,
            logits: LogitsFor::All,
        })
        .collect();
    batch.insert(
        3,
        SeqForward {
            tokens: &target[..16],
            start_pos: 0,
            block_table: &target_table,
            logits: LogitsFor::All,
        },
    );
    let got = crowd.forward(&batch).unwrap();
    let offset: usize = others[..3].iter().map(|(t, _)| t.len()).sum();
    assert_eq!(
        got.len(),
        (offset + 16 + others[3..].iter().map(|(t, _)| t.len()).sum::<usize>()) * vocab
    );
    let got_target = &got[offset * vocab..(offset + 16) * vocab];
    assert!(want_prefill
        .iter()
        .zip(got_target)
        .all(|(a, b)| a.to_bits() == b.to_bits()));

    // A K+1 verify step for the target next to decodes of the others.
    let want_verify = run(&mut alone, &target[16..21], 16, &target_table, true);
    let next: Vec<[u32; 1]> = others.iter().map(|(t, _)| [t[0]]).collect();
    let mut batch: Vec<SeqForward<'_>> = others
        .iter()
        .zip(&next)
        .map(|((t, table), n)| SeqForward {
            tokens: n,
            start_pos: t.len(),
            block_table: table,
            logits: LogitsFor::Last,
        })
        .collect();
    batch.push(SeqForward {
        tokens: &target[16..21],
        start_pos: 16,
        block_table: &target_table,
        logits: LogitsFor::All,
    });
    let got = crowd.forward(&batch).unwrap();
    let got_target = &got[7 * vocab..];
    assert!(want_verify
        .iter()
        .zip(got_target)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn rejects_invalid_batches() {
    let mut b = backend(tiny(WeightType::Q8_0, RopeStyle::Interleaved, false), 4);
    let cases: [(&[u32], usize, &[u32]); 4] = [
        (&[], 0, &[0]),
        (&[256], 0, &[0]),
        (&[1; 17], 0, &[0]),
        (&[1], 0, &[4]),
    ];
    for (tokens, start_pos, block_table) in cases {
        let r = b.forward(&[SeqForward {
            tokens,
            start_pos,
            block_table,
            logits: LogitsFor::Last,
        }]);
        assert!(
            matches!(r, Err(EngineError::InvalidBatch(_))),
            "{tokens:?} {block_table:?}"
        );
    }
    assert!(b.forward(&[]).unwrap().is_empty());
    assert!(CpuBackend::new(b.model().clone(), CpuBackendOptions::new(0)).is_err());
}
