//! Decode benchmark of the CUDA backend on dummy weights generated on the device (default: a
//! Llama-3-8B shape, 16 GB of bf16): tokens/s at each batch size and K, and the step time split
//! into forward, sampling and host transfer. Prints one JSON object per configuration and a
//! Markdown table for docs/benchmarks.md.
//!
//! Build: `cargo build --release -p engine-worker --features cuda --example cuda_bench`
//! (scripts/gpu-bundle.sh does this); run: `cuda_bench --device cuda:0`.
//!
//! Each configuration prefills `batch` prompts of `--prompt-len` random tokens, then runs
//! `--warmup` untimed and `--steps` timed decode steps. With K > 0 every sequence verifies
//! `[last, d_1..d_K]` each step, the drafts being an n-gram guess (the tokens that followed the
//! last occurrence of the current token in the sequence, else repeats of it), so the accepted
//! share is whatever the random model gives; tokens/s counts tokens actually produced.

#[cfg(feature = "cuda")]
fn main() {
    if let Err(e) = bench::run() {
        eprintln!("cuda_bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("cuda_bench needs the `cuda` feature: cargo build --release -p engine-worker --features cuda --example cuda_bench");
    std::process::exit(2);
}

#[cfg(feature = "cuda")]
mod bench {
    use std::time::Instant;

    use clap::Parser;
    use engine_worker::backend::cuda::{parse_cuda_device, CudaBackend, CudaOptions, StepTimings};
    use engine_worker::backend::{LogitsFor, SeqForward};
    use engine_worker::model::ModelConfig;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[derive(Parser, Debug)]
    #[command(about = "Decode tokens/s of the CUDA backend on device-generated dummy weights")]
    struct Args {
        /// Device, `cuda:N`.
        #[arg(long, default_value = "cuda:0", env = "SPECULA_DEVICE")]
        device: String,
        /// Model shape preset (llama-3-8b, smollm2-135m, tiny).
        #[arg(long, default_value = "llama-3-8b")]
        model: String,
        /// Batch sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,32,256")]
        batches: Vec<usize>,
        /// Draft lengths K, comma-separated (0 = no speculation).
        #[arg(long, value_delimiter = ',', default_value = "0,4")]
        ks: Vec<usize>,
        /// Prompt tokens per sequence.
        #[arg(long, default_value_t = 128)]
        prompt_len: usize,
        /// Untimed steps before measuring.
        #[arg(long, default_value_t = 4)]
        warmup: usize,
        /// Timed steps per configuration.
        #[arg(long, default_value_t = 32)]
        steps: usize,
        /// Device memory bandwidth in GB/s, for the "% of bandwidth limit" column (H200: 4800).
        #[arg(long, default_value_t = 4800.0)]
        bandwidth_gbs: f64,
    }

    const BLOCK: usize = 16;

    struct Seq {
        tokens: Vec<u32>,
        /// Tokens whose keys/values are in the cache.
        cached: usize,
        table: Vec<u32>,
    }

    /// An n-gram-style guess: what followed the previous occurrence of the last token.
    fn drafts(tokens: &[u32], k: usize) -> Vec<u32> {
        let last = *tokens.last().expect("non-empty");
        let start = tokens[..tokens.len() - 1]
            .iter()
            .rposition(|&t| t == last)
            .map(|p| p + 1);
        (0..k)
            .map(|i| {
                start
                    .and_then(|s| tokens.get(s + i).copied())
                    .unwrap_or(last)
            })
            .collect()
    }

    pub fn run() -> Result<(), String> {
        let args = Args::parse();
        let ordinal = parse_cuda_device(&args.device)
            .ok_or_else(|| format!("bad --device {}", args.device))?;
        let config = ModelConfig::preset(&args.model)
            .ok_or_else(|| format!("unknown --model {}", args.model))?;
        let max_batch = args.batches.iter().copied().max().unwrap_or(1);
        let max_k = args.ks.iter().copied().max().unwrap_or(0);
        let max_len = args.prompt_len + (args.warmup + args.steps) * (max_k + 1) + max_k + 1;
        let blocks_per_seq = max_len.div_ceil(BLOCK);
        let opts = CudaOptions {
            ordinal,
            block_size: BLOCK,
            num_blocks: Some(max_batch * blocks_per_seq),
            ..CudaOptions::default()
        };
        let load = Instant::now();
        let mut backend =
            CudaBackend::dummy_on_device(&config, &opts, 1).map_err(|e| e.to_string())?;
        backend.synchronize().map_err(|e| e.to_string())?;
        let weight_bytes = backend.weight_bytes();
        eprintln!(
            "device {} (sm_{}{}), model {} ({:.2} GB bf16 weights, generated in {:.1} s)",
            backend.device_name(),
            backend.compute_capability().0,
            backend.compute_capability().1,
            config.name,
            weight_bytes as f64 / 1e9,
            load.elapsed().as_secs_f64()
        );
        let bound_ms = weight_bytes as f64 / (args.bandwidth_gbs * 1e9) * 1e3;
        let mut table = String::from(
            "| batch | K | tokens/s | step ms | forward ms | sampling ms | transfer ms | accepted/drafted | batch-1 % of bandwidth bound |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for &batch in &args.batches {
            for &k in &args.ks {
                let mut seqs: Vec<Seq> = (0..batch)
                    .map(|i| Seq {
                        tokens: (0..args.prompt_len)
                            .map(|_| rng.gen_range(0..config.vocab_size as u32))
                            .collect(),
                        cached: 0,
                        table: (0..blocks_per_seq)
                            .map(|b| (i * blocks_per_seq + b) as u32)
                            .collect(),
                    })
                    .collect();
                // Prefill in groups that keep activations to a few thousand tokens.
                let group = (4096 / args.prompt_len.max(1)).max(1);
                for chunk in seqs.chunks_mut(group) {
                    let fwd: Vec<SeqForward<'_>> = chunk
                        .iter()
                        .map(|s| SeqForward {
                            tokens: &s.tokens,
                            start_pos: 0,
                            block_table: &s.table,
                            logits: LogitsFor::Last,
                        })
                        .collect();
                    let out = backend.verify(&fwd, None).map_err(|e| e.to_string())?;
                    for (s, o) in chunk.iter_mut().zip(out) {
                        s.cached = s.tokens.len();
                        s.tokens.extend(o.tokens);
                    }
                }
                backend.set_profiling(true);
                let mut sums = StepTimings::default();
                let (mut produced, mut drafted, mut accepted) = (0usize, 0usize, 0usize);
                let mut timed = 0.0f64;
                for step in 0..args.warmup + args.steps {
                    let chunks: Vec<Vec<u32>> = seqs
                        .iter()
                        .map(|s| {
                            let mut c = vec![*s.tokens.last().unwrap()];
                            c.extend(drafts(&s.tokens, k));
                            c
                        })
                        .collect();
                    let fwd: Vec<SeqForward<'_>> = seqs
                        .iter()
                        .zip(&chunks)
                        .map(|(s, c)| SeqForward {
                            tokens: c,
                            start_pos: s.cached,
                            block_table: &s.table,
                            logits: if k == 0 {
                                LogitsFor::Last
                            } else {
                                LogitsFor::All
                            },
                        })
                        .collect();
                    let t0 = Instant::now();
                    let out = backend.verify(&fwd, None).map_err(|e| e.to_string())?;
                    let elapsed = t0.elapsed().as_secs_f64();
                    let phases = backend.last_timings().unwrap_or_default();
                    for (s, o) in seqs.iter_mut().zip(&out) {
                        s.cached += 1 + o.accepted;
                        s.tokens.extend(&o.tokens);
                    }
                    if step >= args.warmup {
                        timed += elapsed;
                        sums.forward_s += phases.forward_s;
                        sums.sampling_s += phases.sampling_s;
                        sums.transfer_s += phases.transfer_s;
                        produced += out.iter().map(|o| o.tokens.len()).sum::<usize>();
                        drafted += out.iter().map(|o| o.drafted).sum::<usize>();
                        accepted += out.iter().map(|o| o.accepted).sum::<usize>();
                    }
                }
                backend.set_profiling(false);
                let n = args.steps.max(1) as f64;
                let step_ms = timed / n * 1e3;
                let tps = produced as f64 / timed;
                let pct = if batch == 1 && k == 0 {
                    format!("{:.0}%", bound_ms / step_ms * 100.0)
                } else {
                    "-".into()
                };
                println!(
                    "{{\"model\":\"{}\",\"batch\":{batch},\"k\":{k},\"tokens_per_s\":{tps:.1},\"step_ms\":{step_ms:.3},\"forward_ms\":{:.3},\"sampling_ms\":{:.3},\"transfer_ms\":{:.3},\"drafted\":{drafted},\"accepted\":{accepted},\"bandwidth_bound_ms\":{bound_ms:.3}}}",
                    config.name,
                    sums.forward_s / n * 1e3,
                    sums.sampling_s / n * 1e3,
                    sums.transfer_s / n * 1e3,
                );
                table.push_str(&format!(
                    "| {batch} | {k} | {tps:.0} | {step_ms:.2} | {:.2} | {:.3} | {:.3} | {accepted}/{drafted} | {pct} |\n",
                    sums.forward_s / n * 1e3,
                    sums.sampling_s / n * 1e3,
                    sums.transfer_s / n * 1e3,
                ));
            }
        }
        eprintln!("\n{table}");
        eprintln!(
            "bandwidth bound for one pass over the weights: {bound_ms:.2} ms/step at {} GB/s",
            args.bandwidth_gbs
        );
        Ok(())
    }
}
