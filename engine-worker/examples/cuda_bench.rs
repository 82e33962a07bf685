//! Decode benchmark of the CUDA backend on dummy weights generated on the device (default: a
//! Llama-3-8B shape, 16 GB of bf16): tokens/s at each batch size and K, and the step time split
//! into forward, sampling and host transfer. Prints one JSON object per configuration and a
//! Markdown table for docs/history/benchmarks-notebook.md.
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
    use engine_worker::backend::{Backend, LogitsFor, SeqForward, TokenChoice};
    use engine_worker::model::ModelConfig;
    use proto::api_worker::SamplingParams;
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

    /// Greedy token choice for every sequence (the engine's on-device path).
    const GREEDY: TokenChoice<'static> = TokenChoice {
        sampling: &SamplingParams::GREEDY,
        seed: 0,
        first_position: 0,
        history: engine_worker::sampling::History::EMPTY,
        masks: &[],
    };

    /// One decode measurement: timed steps' wall time and phases, and the tokens they made.
    #[derive(Default)]
    struct Measured {
        timed: f64,
        sums: StepTimings,
        produced: usize,
        drafted: usize,
        accepted: usize,
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
        let mut backend = open_backend(&config, ordinal, max_batch * blocks_per_seq)?;
        let bound_ms = backend.weight_bytes() as f64 / (args.bandwidth_gbs * 1e9) * 1e3;
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
                prefill(&mut backend, &mut seqs, args.prompt_len)?;
                let m = decode(&mut backend, &mut seqs, k, &args)?;
                table.push_str(&report(&config, batch, k, &m, &args, bound_ms));
            }
        }
        eprintln!("\n{table}");
        eprintln!(
            "bandwidth bound for one pass over the weights: {bound_ms:.2} ms/step at {} GB/s",
            args.bandwidth_gbs
        );
        Ok(())
    }

    /// The backend with device-generated weights and `num_blocks` KV blocks.
    fn open_backend(
        config: &ModelConfig,
        ordinal: usize,
        num_blocks: usize,
    ) -> Result<CudaBackend, String> {
        let opts = CudaOptions {
            ordinal,
            block_size: BLOCK,
            num_blocks: Some(num_blocks),
            ..CudaOptions::default()
        };
        let load = Instant::now();
        let backend = CudaBackend::dummy_on_device(config, &opts, 1).map_err(|e| e.to_string())?;
        backend.synchronize().map_err(|e| e.to_string())?;
        eprintln!(
            "device {} (sm_{}{}), model {} ({:.2} GB bf16 weights, generated in {:.1} s)",
            backend.device_name(),
            backend.compute_capability().0,
            backend.compute_capability().1,
            config.name,
            backend.weight_bytes() as f64 / 1e9,
            load.elapsed().as_secs_f64()
        );
        Ok(backend)
    }

    /// Prefills in groups that keep activations to a few thousand tokens.
    fn prefill(
        backend: &mut CudaBackend,
        seqs: &mut [Seq],
        prompt_len: usize,
    ) -> Result<(), String> {
        let group = (4096 / prompt_len.max(1)).max(1);
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
            let out = backend
                .forward_and_verify(&fwd, &vec![GREEDY; fwd.len()])
                .map_err(|e| e.to_string())?;
            for (s, o) in chunk.iter_mut().zip(out) {
                s.cached = s.tokens.len();
                s.tokens.extend(o.tokens);
            }
        }
        Ok(())
    }

    /// `--warmup` untimed then `--steps` timed decode steps of K drafts each.
    fn decode(
        backend: &mut CudaBackend,
        seqs: &mut [Seq],
        k: usize,
        args: &Args,
    ) -> Result<Measured, String> {
        backend.set_profiling(true);
        let mut m = Measured::default();
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
            let choices = vec![GREEDY; fwd.len()];
            let t0 = Instant::now();
            let out = backend
                .forward_and_verify(&fwd, &choices)
                .map_err(|e| e.to_string())?;
            let elapsed = t0.elapsed().as_secs_f64();
            let phases = backend.last_timings().unwrap_or_default();
            for (s, o) in seqs.iter_mut().zip(&out) {
                s.cached += 1 + o.accepted;
                s.tokens.extend(&o.tokens);
            }
            if step >= args.warmup {
                m.timed += elapsed;
                m.sums.forward_s += phases.forward_s;
                m.sums.sampling_s += phases.sampling_s;
                m.sums.transfer_s += phases.transfer_s;
                m.produced += out.iter().map(|o| o.tokens.len()).sum::<usize>();
                m.drafted += out.iter().map(|o| o.drafted).sum::<usize>();
                m.accepted += out.iter().map(|o| o.accepted).sum::<usize>();
            }
        }
        backend.set_profiling(false);
        Ok(m)
    }

    /// Prints the configuration's JSON line and returns its Markdown table row.
    fn report(
        config: &ModelConfig,
        batch: usize,
        k: usize,
        m: &Measured,
        args: &Args,
        bound_ms: f64,
    ) -> String {
        let (drafted, accepted) = (m.drafted, m.accepted);
        let n = args.steps.max(1) as f64;
        let step_ms = m.timed / n * 1e3;
        let tps = m.produced as f64 / m.timed;
        let pct = if batch == 1 && k == 0 {
            format!("{:.0}%", bound_ms / step_ms * 100.0)
        } else {
            "-".into()
        };
        println!(
            "{{\"model\":\"{}\",\"batch\":{batch},\"k\":{k},\"tokens_per_s\":{tps:.1},\"step_ms\":{step_ms:.3},\"forward_ms\":{:.3},\"sampling_ms\":{:.3},\"transfer_ms\":{:.3},\"drafted\":{drafted},\"accepted\":{accepted},\"bandwidth_bound_ms\":{bound_ms:.3}}}",
            config.name,
            m.sums.forward_s / n * 1e3,
            m.sums.sampling_s / n * 1e3,
            m.sums.transfer_s / n * 1e3,
        );
        format!(
            "| {batch} | {k} | {tps:.0} | {step_ms:.2} | {:.2} | {:.3} | {:.3} | {accepted}/{drafted} | {pct} |\n",
            m.sums.forward_s / n * 1e3,
            m.sums.sampling_s / n * 1e3,
            m.sums.transfer_s / n * 1e3,
        )
    }
}
