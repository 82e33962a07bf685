//! GPU parity tests (feature `cuda`). Each test skips with a printed reason when no CUDA GPU is
//! usable, and fails instead under `SPECULA_REQUIRE_GPU=1` (scripts/gpu-check.sh sets it).
//!
//! - the CUDA forward on a batch mixing prefill, decode, chunked prefill and K+1 verification
//!   against a plain f32 host reference of the same seeded dummy weights;
//! - the paged-attention kernel against a plain reference at ragged lengths;
//! - on-device greedy verification against the same decisions made on the host from the
//!   downloaded logits, and `Backend::forward_and_verify` choosing exactly the host's tokens
//!   (sampled batches are decided on the host);
//! - the engine's greedy output with and without speculation on the GPU.
#![cfg(feature = "cuda")]

mod common;
mod cuda_support;

use std::collections::HashMap;

use common::{engine_config, request, run_to_completion, Outcome};
use cuda_support::{assert_close, gpu_or_skip, small_llama, Reference};
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::backend::cuda::harness::{paged_attention, AttentionCase};
use engine_worker::backend::cuda::{CudaBackend, CudaOptions};
use engine_worker::backend::{verify_on_host, Backend, LogitsFor, SeqForward, TokenChoice};
use engine_worker::engine::Engine;
use engine_worker::model::{Model, ModelConfig, RopeStyle, WeightType};
use engine_worker::spec::DraftSource;
use half::bf16;
use proto::api_worker::SamplingParams;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BLOCK: usize = 16;

fn options(ordinal: usize) -> CudaOptions {
    CudaOptions {
        ordinal,
        block_size: BLOCK,
        num_blocks: Some(64),
        ..CudaOptions::default()
    }
}

fn random_tokens(rng: &mut ChaCha8Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

/// Two steps on scattered block tables: (1) prefill A (13 tokens, last row), B (7, last row),
/// C (20, every row); (2) decode A, verify 1 + 4 drafts of B (every row), prefill the next 9
/// tokens of C (last row). Returns each step's `[rows, vocab]` logits as rows, and the rows the
/// reference (recomputed from scratch, so it also checks what step 1 left in the cache) wants.
fn mixed_batch<B: Backend>(
    backend: &mut B,
    reference: &Reference,
) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    let v = backend.config().vocab_size;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (a, b, c) = (
        random_tokens(&mut rng, 14, v),
        random_tokens(&mut rng, 12, v),
        random_tokens(&mut rng, 29, v),
    );
    let (ta, tb, tc) = ([5u32, 9], [3u32, 40, 12], [7u32, 1, 22, 30]);
    let step1 = backend
        .forward(&[
            SeqForward::new(&a[..13], 0, &ta, LogitsFor::Last),
            SeqForward::new(&b[..7], 0, &tb, LogitsFor::Last),
            SeqForward::new(&c[..20], 0, &tc, LogitsFor::All),
        ])
        .unwrap();
    let step2 = backend
        .forward(&[
            SeqForward::new(&a[13..14], 13, &ta, LogitsFor::Last),
            SeqForward::new(&b[7..12], 7, &tb, LogitsFor::All),
            SeqForward::new(&c[20..29], 20, &tc, LogitsFor::Last),
        ])
        .unwrap();
    let (ref_a, ref_b, ref_c) = (
        reference.logits(&a),
        reference.logits(&b),
        reference.logits(&c),
    );
    let mut want: Vec<(String, Vec<f32>)> = vec![
        (
            "step 1, A prefill last".into(),
            reference.logits(&a[..13])[12].clone(),
        ),
        (
            "step 1, B prefill last".into(),
            reference.logits(&b[..7])[6].clone(),
        ),
    ];
    for (i, row) in ref_c[..20].iter().enumerate() {
        want.push((format!("step 1, C prefill row {i}"), row.clone()));
    }
    want.push(("step 2, A decode".into(), ref_a[13].clone()));
    for i in 0..5 {
        want.push((format!("step 2, B verify row {i}"), ref_b[7 + i].clone()));
    }
    want.push(("step 2, C chunk last".into(), ref_c[28].clone()));
    let got: Vec<&[f32]> = step1.chunks_exact(v).chain(step2.chunks_exact(v)).collect();
    assert_eq!(got.len(), want.len(), "logit rows");
    got.iter()
        .zip(want)
        .map(|(g, (name, w))| (name, g.to_vec(), w))
        .collect()
}

fn cpu_backend(model: &Model) -> CpuBackend {
    let mut opts = CpuBackendOptions::new(64);
    opts.block_size = BLOCK;
    CpuBackend::new(model.clone(), opts).unwrap()
}

/// The GPU's logits on the mixed batch against the reference and against the CPU backend on
/// the same seeded dummy weights.
fn mixed_batch_matches_reference(config: ModelConfig, dtype: WeightType, test: &str) {
    let Some(ordinal) = gpu_or_skip(test) else {
        return;
    };
    let model = Model::dummy(config, dtype, 11).unwrap();
    let reference = Reference::new(&model);
    let mut gpu = CudaBackend::new(&model.config, &model.weights, &options(ordinal)).unwrap();
    let gpu_rows = mixed_batch(&mut gpu, &reference);
    let cpu_rows = mixed_batch(&mut cpu_backend(&model), &reference);
    for ((name, got, want), (_, cpu, _)) in gpu_rows.iter().zip(&cpu_rows) {
        assert_close(&format!("{name} (GPU vs reference)"), got, want);
        assert_close(&format!("{name} (GPU vs CPU backend)"), got, cpu);
    }
}

/// No GPU needed: the host reference the GPU tests trust agrees with the CPU backend, for every
/// weight layout the GPU tests use. (The CPU backend keeps f32 activations, so this is tight.)
#[test]
fn cuda_reference_matches_cpu_backend() {
    let mut bias = small_llama(RopeStyle::HalfSplit);
    bias.attention_bias = true;
    bias.tie_word_embeddings = true;
    for (config, dtype) in [
        (small_llama(RopeStyle::Interleaved), WeightType::Q4_1),
        (small_llama(RopeStyle::HalfSplit), WeightType::BF16),
        (bias, WeightType::F16),
    ] {
        let model = Model::dummy(config, dtype, 11).unwrap();
        let reference = Reference::new(&model);
        for (name, got, want) in mixed_batch(&mut cpu_backend(&model), &reference) {
            assert_close(&format!("{name} ({dtype}, CPU vs reference)"), &got, &want);
        }
    }
}

#[test]
fn cuda_gguf_style_weights_match_reference_on_mixed_batch() {
    // Q4_1 dequantized at load, adjacent-pair RoPE: the layout of GGUF llama files.
    mixed_batch_matches_reference(
        small_llama(RopeStyle::Interleaved),
        WeightType::Q4_1,
        "cuda_gguf_style",
    );
}

#[test]
fn cuda_bf16_weights_match_reference_on_mixed_batch() {
    // bf16 copied as is, half-split RoPE: Hugging Face safetensors.
    mixed_batch_matches_reference(
        small_llama(RopeStyle::HalfSplit),
        WeightType::BF16,
        "cuda_bf16",
    );
}

#[test]
fn cuda_qkv_bias_and_tied_embeddings_match_reference() {
    let mut config = small_llama(RopeStyle::HalfSplit);
    config.attention_bias = true;
    config.tie_word_embeddings = true;
    mixed_batch_matches_reference(config, WeightType::F16, "cuda_qkv_bias");
}

#[test]
fn cuda_paged_attention_matches_plain_reference_at_ragged_lengths() {
    let Some(ordinal) = gpu_or_skip("cuda_paged_attention") else {
        return;
    };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for &(q_heads, kv_heads, head_dim) in &[
        (8usize, 2usize, 64usize),
        (8, 1, 32),
        (4, 4, 128),
        (6, 3, 16),
        (2, 1, 256),
    ] {
        let lens = [1usize, 5, 16, 17, 33, 100];
        let block_size = 16;
        let max_blocks = lens.iter().map(|l| l.div_ceil(block_size)).max().unwrap();
        let num_blocks = lens.iter().map(|l| l.div_ceil(block_size)).sum::<usize>() + 3;
        let kv_dim = kv_heads * head_dim;
        // Blocks handed out in a shuffled order, so tables are not contiguous.
        let mut free: Vec<u32> = (0..num_blocks as u32).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, rng.gen_range(0..=i));
        }
        let mut tables = vec![0u32; lens.len() * max_blocks];
        for (s, &len) in lens.iter().enumerate() {
            for b in 0..len.div_ceil(block_size) {
                tables[s * max_blocks + b] = free.pop().unwrap();
            }
        }
        let bf = |x: f32| bf16::from_f32(x).to_bits();
        let k_cache: Vec<u16> = (0..num_blocks * block_size * kv_dim)
            .map(|_| bf(rng.gen_range(-2.0..2.0)))
            .collect();
        let v_cache: Vec<u16> = (0..num_blocks * block_size * kv_dim)
            .map(|_| bf(rng.gen_range(-1.0..1.0)))
            .collect();
        // Up to three query tokens per sequence, at its last positions (a verify chunk).
        let (mut token_seq, mut positions) = (Vec::new(), Vec::new());
        for (s, &len) in lens.iter().enumerate() {
            for p in len.saturating_sub(3)..len {
                token_seq.push(s as u32);
                positions.push(p as u32);
            }
        }
        let q_dim = q_heads * head_dim;
        let q: Vec<f32> = (0..positions.len() * q_dim)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let case = AttentionCase {
            q_heads,
            kv_heads,
            head_dim,
            block_size,
            q: q.clone(),
            k_cache: k_cache.clone(),
            v_cache: v_cache.clone(),
            block_tables: tables.clone(),
            max_blocks,
            token_seq: token_seq.clone(),
            positions: positions.clone(),
            grouped: false,
        };
        for grouped in [false, true] {
            let case = AttentionCase {
                grouped,
                ..case.clone()
            };
            let got = paged_attention(ordinal, &case).unwrap();
            let f = |b: u16| bf16::from_bits(b).to_f32();
            for (t, (&s, &pos)) in token_seq.iter().zip(&positions).enumerate() {
                for h in 0..q_heads {
                    let kvh = h / (q_heads / kv_heads);
                    let slot = |p: usize| {
                        tables[s as usize * max_blocks + p / block_size] as usize * block_size
                            + p % block_size
                    };
                    let qh = &q[t * q_dim + h * head_dim..][..head_dim];
                    let scores: Vec<f64> = (0..=pos as usize)
                        .map(|p| {
                            let k = &k_cache[slot(p) * kv_dim + kvh * head_dim..][..head_dim];
                            qh.iter()
                                .zip(k)
                                .map(|(a, &b)| f64::from(*a) * f64::from(f(b)))
                                .sum::<f64>()
                                / (head_dim as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for d in 0..head_dim {
                        let want: f64 = scores
                            .iter()
                            .enumerate()
                            .map(|(p, s)| {
                                (s - max).exp() / sum
                                    * f64::from(f(v_cache[slot(p) * kv_dim + kvh * head_dim + d]))
                            })
                            .sum();
                        let g = f64::from(got[t * q_dim + h * head_dim + d]);
                        assert!(
                        (g - want).abs() <= 1e-2 * want.abs().max(0.1),
                        "grouped={grouped} heads {q_heads}:{kv_heads} dim {head_dim}, seq {s} pos {pos} head {h} dim {d}: {g} vs {want}"
                    );
                    }
                }
            }
        }
    }
}

/// Host greedy acceptance over `[rows, vocab]` logits of one verify sequence.
fn host_greedy(rows: &[&[f32]], drafts: &[u32]) -> (Vec<u32>, usize) {
    let argmax = |r: &[f32]| {
        r.iter()
            .enumerate()
            .fold((0u32, f32::NEG_INFINITY), |b, (i, &x)| {
                if x > b.1 {
                    (i as u32, x)
                } else {
                    b
                }
            })
            .0
    };
    let mut out = Vec::new();
    for (i, &d) in drafts.iter().enumerate() {
        if argmax(rows[i]) != d {
            out.push(argmax(rows[i]));
            return (out, i);
        }
        out.push(d);
    }
    out.push(argmax(rows[drafts.len()]));
    (out, drafts.len())
}

/// Prefills the same prompts on two backends with the same weights, then runs the same verify
/// batch as `forward` (logits to the host) on one and as `verify_on_device` on the other.
fn verify_setup(ordinal: usize) -> (CudaBackend, CudaBackend, Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let config = small_llama(RopeStyle::HalfSplit);
    let model = Model::dummy(config.clone(), WeightType::BF16, 21).unwrap();
    let mut host_side = CudaBackend::new(&model.config, &model.weights, &options(ordinal)).unwrap();
    let mut device_side =
        CudaBackend::new(&model.config, &model.weights, &options(ordinal)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| random_tokens(&mut rng, 5 + 7 * i, config.vocab_size))
        .collect();
    let tables: Vec<Vec<u32>> = (0..4u32)
        .map(|i| (0..4).map(|b| i * 4 + b).collect())
        .collect();
    let prefill: Vec<SeqForward<'_>> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqForward::new(p, 0, t, LogitsFor::Last))
        .collect();
    let last = host_side.forward(&prefill).unwrap();
    device_side.forward(&prefill).unwrap();
    // Drafts: the model's own greedy pick first (so some are accepted), then random ones.
    let chunks: Vec<Vec<u32>> = last
        .chunks_exact(config.vocab_size)
        .enumerate()
        .map(|(i, row)| {
            let top = row
                .iter()
                .enumerate()
                .fold((0u32, f32::NEG_INFINITY), |b, (j, &x)| {
                    if x > b.1 {
                        (j as u32, x)
                    } else {
                        b
                    }
                })
                .0;
            let mut chunk = vec![*prompts[i].last().unwrap()];
            chunk.push(top);
            chunk.extend(random_tokens(&mut rng, i % 4, config.vocab_size));
            chunk
        })
        .collect();
    (host_side, device_side, chunks, tables)
}

#[test]
fn cuda_greedy_verify_on_device_matches_host_decisions() {
    let Some(ordinal) = gpu_or_skip("cuda_greedy_verify") else {
        return;
    };
    let (mut host_side, mut device_side, chunks, tables) = verify_setup(ordinal);
    let v = host_side.config().vocab_size;
    // The chunk's first token is the last prompt token again: it sits at position len - 1 of
    // the prompt, whose slot the prefill already wrote; rewriting it is idempotent.
    let prompt_lens = [5usize, 12, 19, 26];
    let batch: Vec<SeqForward<'_>> = chunks
        .iter()
        .zip(&tables)
        .zip(prompt_lens)
        .map(|((c, t), len)| SeqForward::new(c, len - 1, t, LogitsFor::All))
        .collect();
    let logits = host_side.forward(&batch).unwrap();
    let outcomes = device_side.verify_on_device(&batch).unwrap();
    let mut row = 0;
    let mut accepted_total = 0;
    for (i, c) in chunks.iter().enumerate() {
        let rows: Vec<&[f32]> = logits[row * v..(row + c.len()) * v]
            .chunks_exact(v)
            .collect();
        let (tokens, accepted) = host_greedy(&rows, &c[1..]);
        assert_eq!(outcomes[i].tokens, tokens, "sequence {i}");
        assert_eq!(
            (outcomes[i].drafted, outcomes[i].accepted),
            (c.len() - 1, accepted),
            "sequence {i}"
        );
        accepted_total += accepted;
        row += c.len();
    }
    assert!(
        accepted_total > 0,
        "the model's own greedy draft should be accepted"
    );
}

#[test]
fn cuda_forward_and_verify_chooses_what_the_host_chooses() {
    let Some(ordinal) = gpu_or_skip("cuda_forward_and_verify") else {
        return;
    };
    let sampled = SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        top_k: 0,
        seed: Some(3),
        ..SamplingParams::GREEDY
    };
    // All greedy (decided on the device), then a batch with a sampled request (on the host).
    let greedy = SamplingParams::GREEDY;
    for params in [SamplingParams::GREEDY, sampled] {
        let (mut host_side, mut device_side, chunks, tables) = verify_setup(ordinal);
        let v = host_side.config().vocab_size;
        let prompt_lens = [5usize, 12, 19, 26];
        let batch: Vec<SeqForward<'_>> = chunks
            .iter()
            .zip(&tables)
            .zip(prompt_lens)
            .map(|((c, t), len)| SeqForward::new(c, len - 1, t, LogitsFor::All))
            .collect();
        let choices: Vec<TokenChoice<'_>> = (0..batch.len())
            .map(|i| TokenChoice {
                sampling: if i == 0 { &params } else { &greedy },
                seed: 11 + i as u64,
                first_position: i,
                history: engine_worker::sampling::History::EMPTY,
                masks: &[],
            })
            .collect();
        let logits = host_side.forward(&batch).unwrap();
        let want = verify_on_host(&logits, v, &batch, &choices).unwrap();
        let got = device_side.forward_and_verify(&batch, &choices).unwrap();
        assert_eq!(got, want, "{params:?}");
    }
}

/// Each prompt's outcome, greedy, `max_tokens` each, in prompt order.
fn greedy_outcomes<B: Backend>(
    mut engine: Engine<B>,
    prompts: &[Vec<u32>],
    max_tokens: u32,
) -> Vec<Outcome> {
    for (i, p) in prompts.iter().enumerate() {
        engine
            .add_request(request(
                i as u64,
                p.clone(),
                max_tokens,
                SamplingParams::GREEDY,
            ))
            .unwrap();
    }
    let mut outcomes = HashMap::new();
    run_to_completion(&mut engine, &mut outcomes);
    (0..prompts.len() as u64)
        .map(|i| outcomes[&i].clone())
        .collect()
}

#[test]
fn cuda_greedy_output_is_identical_with_and_without_speculation() {
    let Some(ordinal) = gpu_or_skip("cuda_greedy_spec") else {
        return;
    };
    let config = small_llama(RopeStyle::Interleaved);
    let model = Model::dummy(config.clone(), WeightType::BF16, 4).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    // Repetitive prompts give the n-gram proposer material to draft from.
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|_| {
            let (motif_len, len) = (rng.gen_range(2..6), rng.gen_range(8..40));
            let motif = random_tokens(&mut rng, motif_len, config.vocab_size);
            motif.iter().cycle().take(len).copied().collect()
        })
        .collect();
    let run = |k: usize| {
        let backend = CudaBackend::new(
            &model.config,
            &model.weights,
            &CudaOptions {
                ordinal,
                block_size: BLOCK,
                num_blocks: Some(256),
                ..CudaOptions::default()
            },
        )
        .unwrap();
        greedy_outcomes(
            Engine::new(backend, engine_config(k, 8), None),
            &prompts,
            48,
        )
    };
    let plain = run(0);
    let spec = run(4);
    let mut drafted = 0;
    for i in 0..prompts.len() {
        assert_eq!(
            plain[i].tokens, spec[i].tokens,
            "request {i}: speculation changed greedy output"
        );
        drafted += spec[i].steps.iter().map(|s| s.0 as usize).sum::<usize>();
    }
    assert!(
        drafted > 0,
        "the n-gram proposer should have drafted on repetitive prompts"
    );
}

#[test]
fn cuda_device_generated_dummy_weights_decode() {
    // The benchmark's weights: generated on the device. Checks they give finite, non-constant
    // logits and that greedy decoding through `verify_on_device` is deterministic.
    let Some(ordinal) = gpu_or_skip("cuda_device_dummy") else {
        return;
    };
    let config = small_llama(RopeStyle::HalfSplit);
    let decode = || {
        let mut gpu = CudaBackend::dummy_on_device(&config, &options(ordinal), 3).unwrap();
        let table: Vec<u32> = (0..8).collect();
        let mut tokens = vec![1u32, 2, 3, 4, 5];
        let logits = gpu
            .forward(&[SeqForward::new(&tokens, 0, &table, LogitsFor::Last)])
            .unwrap();
        assert!(logits.iter().all(|v| v.is_finite()));
        let (lo, hi) = logits
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        assert!(hi - lo > 1e-3, "logits are constant");
        for _ in 0..8 {
            let pos = tokens.len() - 1;
            let step = [*tokens.last().unwrap()];
            let out = gpu
                .verify_on_device(&[SeqForward::new(&step, pos, &table, LogitsFor::Last)])
                .unwrap();
            assert_eq!(
                (out[0].drafted, out[0].accepted, out[0].tokens.len()),
                (0, 0, 1)
            );
            tokens.push(out[0].tokens[0]);
        }
        tokens
    };
    assert_eq!(decode(), decode());
}

/// The model drafters on the GPU: the first layer's early-exit logits equal the CPU backend's on
/// the same weights, and greedy output with a draft model (the first layer as its own model, in
/// its own GPU cache) and with `--draft-layers 1` equals the GPU's output without speculation.
#[test]
fn cuda_model_drafters_match_the_cpu_backend_and_keep_greedy_output() {
    let Some(ordinal) = gpu_or_skip("cuda_model_drafters") else {
        return;
    };
    let config = small_llama(RopeStyle::Interleaved);
    let model = Model::dummy(config.clone(), WeightType::BF16, 6).unwrap();
    let gpu_backend = |m: &Model| {
        CudaBackend::new(
            &m.config,
            &m.weights,
            &CudaOptions {
                ordinal,
                block_size: BLOCK,
                num_blocks: Some(256),
                ..CudaOptions::default()
            },
        )
        .unwrap()
    };

    // Early exit after one layer, prefill then decode, on both backends.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let tokens = random_tokens(&mut rng, 21, config.vocab_size);
    let table = [4u32, 1, 7];
    let early = |b: &mut dyn Backend| {
        let mut rows = b
            .forward_first_layers(
                &[SeqForward::new(&tokens[..20], 0, &table, LogitsFor::All)],
                1,
            )
            .unwrap();
        rows.extend(
            b.forward_first_layers(
                &[SeqForward::new(&tokens[20..], 20, &table, LogitsFor::Last)],
                1,
            )
            .unwrap(),
        );
        rows
    };
    let gpu_rows = early(&mut gpu_backend(&model));
    let cpu_rows = early(&mut cpu_backend(&model));
    assert_close(
        "first-layer logits (GPU vs CPU backend)",
        &gpu_rows,
        &cpu_rows,
    );

    // Greedy output, lossless with either drafter.
    let prompts: Vec<Vec<u32>> = (0..6)
        .map(|_| {
            let len = rng.gen_range(8..40);
            random_tokens(&mut rng, len, config.vocab_size)
        })
        .collect();
    let run = |k: usize, draft: Option<DraftSource>| {
        let engine =
            Engine::with_drafter(gpu_backend(&model), engine_config(k, 8), None, draft).unwrap();
        greedy_outcomes(engine, &prompts, 32)
    };
    let plain = run(0, None);
    let draft_model: Box<dyn Backend> = Box::new(gpu_backend(&model.first_layers(1)));
    for (name, draft) in [
        ("draft model", DraftSource::Model(draft_model)),
        ("draft layers", DraftSource::TargetLayers(1)),
    ] {
        let spec = run(4, Some(draft));
        let mut drafted = 0;
        for i in 0..prompts.len() {
            assert_eq!(plain[i].tokens, spec[i].tokens, "{name}: request {i}");
            drafted += spec[i].steps.iter().map(|s| s.0 as usize).sum::<usize>();
        }
        assert!(drafted > 0, "{name}: nothing drafted");
    }
}
