//! End-to-end engine benchmark on the CPU backend: decode tokens/s for 1 and 8 streams, with
//! and without speculation (n-gram or suffix-tree proposer), on a repetitive and a free-form prompt; mean accepted length
//! (tokens per verification step) and peak RSS. Prompts are token ids from the golden files, so
//! no tokenizer is needed. Output: one Markdown table row per configuration.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions, Isa};
use engine_worker::engine::{Engine, EngineConfig, ProposerKind, RowKind};
use engine_worker::kv::KvDtype;
use engine_worker::model::{LoadFormat, Model, TokenizerData, WeightType};
use engine_worker::spec::SpecPolicy;
use proto::api_worker::{AddRequest, SamplingParams, StopConditions};

#[derive(Debug, Parser)]
struct Args {
    /// GGUF model file.
    #[arg(long, env = "SPECULA_MODEL", default_value = vocab::DEFAULT_MODEL_PATH)]
    model: PathBuf,
    /// Golden prompt directory (prompt ids).
    #[arg(long, default_value = "../shared/golden/smollm2")]
    golden: PathBuf,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 128)]
    tokens: u32,
    /// Comma list of stream counts.
    #[arg(long, default_value = "1,8", value_delimiter = ',')]
    streams: Vec<usize>,
    /// Comma list of K values.
    #[arg(long, default_value = "0,4", value_delimiter = ',')]
    k: Vec<usize>,
    /// Forward-pass threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Kernel instruction set: avx512, avx2 or scalar (default: the best this CPU has; an
    /// unsupported choice falls back to it).
    #[arg(long, env = "SPECULA_CPU_ISA")]
    cpu_isa: Option<Isa>,
    /// Shortest n-gram the proposer matches.
    #[arg(long, default_value_t = EngineConfig::default().ngram_min)]
    ngram_min: usize,
    /// Longest n-gram the proposer matches.
    #[arg(long, default_value_t = EngineConfig::default().ngram_max)]
    ngram_max: usize,
    /// Comma list of drafting policies for K > 0: goodput, fixed.
    #[arg(
        long,
        value_enum,
        default_value = "goodput,fixed",
        value_delimiter = ','
    )]
    policies: Vec<SpecPolicy>,
    /// Comma list of proposers for K > 0: ngram, suffix.
    #[arg(long, value_enum, default_value = "ngram", value_delimiter = ',')]
    proposers: Vec<ProposerKind>,
    /// Untimed rounds of the same requests on the same engine before the timed one: the timed
    /// requests repeat earlier ones (what the suffix proposer's shared trie is for).
    #[arg(long, default_value_t = 0)]
    warm_rounds: u64,
    /// KV cache precision: f32, f16, bf16 or q8_0.
    #[arg(long, env = "SPECULA_KV_CACHE_DTYPE", default_value_t = KvDtype::default())]
    kv_cache_dtype: KvDtype,
    /// Comma list of prompts to run: repetitive, free-form.
    #[arg(long, default_value = "repetitive,free-form", value_delimiter = ',')]
    prompts: Vec<String>,
}

fn prompt_ids(dir: &std::path::Path, name: &str) -> anyhow::Result<Vec<u32>> {
    let path = dir.join(name);
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?,
    )?;
    Ok(json["prompt_ids"]
        .as_array()
        .context("prompt_ids")?
        .iter()
        .map(|v| v.as_u64().unwrap_or(0) as u32)
        .collect())
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

struct Run {
    decode_tok_s: f64,
    total_tok_s: f64,
    mean_accept_len: f64,
}

/// Queues `streams` greedy requests for `prompt`, ids from `first_id`.
fn add_requests<B: engine_worker::backend::Backend>(
    engine: &mut Engine<B>,
    prompt: &[u32],
    streams: usize,
    first_id: u64,
    tokens: u32,
) -> anyhow::Result<()> {
    for id in first_id..first_id + streams as u64 {
        engine
            .add_request(AddRequest {
                id,
                prompt_token_ids: prompt.to_vec(),
                sampling: SamplingParams::GREEDY,
                stop: StopConditions {
                    ignore_eos: true,
                    ..StopConditions::default()
                },
                max_tokens: tokens,
                arrival_unix_ms: 0,
                owner: "bench".into(),
                class: "other".into(),
            })
            .map_err(|r| anyhow::anyhow!("rejected: {r:?}"))?;
    }
    Ok(())
}

fn bench(
    model: &Model,
    prompt: &[u32],
    k: usize,
    (policy, proposer): (SpecPolicy, ProposerKind),
    streams: usize,
    args: &Args,
) -> anyhow::Result<Run> {
    let (tokens, threads) = (args.tokens, args.threads);
    let vocab = model.tokenizer.as_ref().map(TokenizerData::token_bytes);
    let mut options = CpuBackendOptions::new(1024);
    options.threads = threads;
    options.isa = args.cpu_isa;
    options.kv_dtype = args.kv_cache_dtype;
    let backend = CpuBackend::new(model.clone(), options)?;
    let cfg = EngineConfig {
        num_spec_tokens: k,
        spec_policy: policy,
        proposer,
        max_num_seqs: streams,
        ngram_min: args.ngram_min,
        ngram_max: args.ngram_max,
        // Every stream sends the same prompt, and the end-to-end figure includes its prefill.
        prefix_caching: false,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(backend, cfg, vocab);
    for round in 0..args.warm_rounds {
        add_requests(&mut engine, prompt, streams, round * streams as u64, tokens)?;
        while engine.has_work() {
            engine.step();
        }
    }
    let first_id = args.warm_rounds * streams as u64;
    add_requests(&mut engine, prompt, streams, first_id, tokens)?;
    let start = Instant::now();
    let mut decode_start = None;
    let (mut decode_tokens, mut all_tokens, mut steps, mut produced) =
        (0usize, 0usize, 0usize, 0usize);
    while engine.has_work() {
        let rows = engine.step();
        for row in &rows {
            all_tokens += row.tokens.len();
            if row.kind == RowKind::Verify {
                decode_tokens += row.tokens.len();
                steps += 1;
                produced += row.accepted as usize + 1;
            }
        }
        // Decode time starts once every stream has prefilled.
        if decode_start.is_none() && rows.iter().filter(|r| r.kind == RowKind::Prefill).count() > 0
        {
            decode_start = Some(Instant::now());
        }
    }
    let end = Instant::now();
    let decode_secs = (end - decode_start.unwrap_or(start)).as_secs_f64();
    Ok(Run {
        decode_tok_s: decode_tokens as f64 / decode_secs,
        total_tok_s: all_tokens as f64 / (end - start).as_secs_f64(),
        mean_accept_len: produced as f64 / steps.max(1) as f64,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Logs (the engine's verify-cost calibration among them) go to stderr.
    link::service::init_tracing(false);
    let model = Model::load(&args.model, LoadFormat::Gguf, WeightType::Q4_1, 0)?;
    // Repetitive: the code prompt's ids three times over (the model keeps repeating it);
    // free-form: the story prompt.
    let code = prompt_ids(&args.golden, "code.json")?;
    let repetitive: Vec<u32> = code.iter().chain(&code).chain(&code).copied().collect();
    let free = prompt_ids(&args.golden, "story.json")?;
    let policies = &args.policies;
    let proposers: Vec<_> = args
        .proposers
        .iter()
        .map(|&kind| (kind, kind.name()))
        .collect();
    anyhow::ensure!(!proposers.is_empty(), "--proposers is empty");
    println!(
        "| prompt | streams | K | proposer | policy | decode tok/s | end-to-end tok/s | mean accepted length |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, prompt) in [("repetitive", &repetitive), ("free-form", &free)] {
        if !args.prompts.iter().any(|p| p == name) {
            continue;
        }
        for &streams in &args.streams {
            for &k in &args.k {
                let runs: Vec<_> = if k == 0 {
                    vec![(SpecPolicy::Fixed, proposers[0])]
                } else {
                    proposers
                        .iter()
                        .flat_map(|&p| policies.iter().map(move |&policy| (policy, p)))
                        .collect()
                };
                for (policy, (proposer, proposer_name)) in runs {
                    let r = bench(&model, prompt, k, (policy, proposer), streams, &args)?;
                    let (shown, by) = if k == 0 {
                        ("-", "-")
                    } else {
                        (policy.name(), proposer_name)
                    };
                    println!(
                        "| {name} | {streams} | {k} | {by} | {shown} | {:.1} | {:.1} | {:.2} |",
                        r.decode_tok_s, r.total_tok_s, r.mean_accept_len
                    );
                }
            }
        }
    }
    println!("\npeak RSS: {:.0} MiB", peak_rss_mib());
    Ok(())
}
