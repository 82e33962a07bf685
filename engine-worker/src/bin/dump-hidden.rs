//! The engine's hidden-state extraction mode, for training an EAGLE-3 draft head
//! (`scripts/train-draft-head.py`; Li et al. 2025, <https://arxiv.org/abs/2503.01840>): runs the
//! target over token sequences with the CPU backend's own forward and writes, for every
//! position, the residual stream entering each captured layer, the same rows a draft head is
//! handed when serving (`Backend::capture_hidden`). No second implementation of the model.
//!
//! Input: JSON lines with `cid`, `prompt_ids` and `output_ids` (what
//! `scripts/draft_head/responses.py` writes). Output, in `--out`:
//! - `hidden.f16`: little-endian f16 rows `[positions, layers * hidden]`, sequences one after
//!   another, each row the captured layers' states side by side in `--layers` order;
//! - `index.jsonl`: per sequence `{"cid", "offset" (first row), "len", "prompt_len", "tokens"}`;
//! - `meta.json`: the model, `layers`, `hidden_size`, `dtype`;
//! - `config.json`: the target's hyper-parameters, in Hugging Face's names (the head's defaults);
//! - `target.safetensors`: the target's token embedding (`embed_tokens.weight`, f16) and final
//!   norm (`norm.weight`, f32), which a head shares.
//!
//! Resumes: sequences already in the index are skipped, and rows past the last indexed
//! sequence (a stopped run's) are cut off first.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::backend::{Backend, LogitsFor, SeqForward};
use engine_worker::kv::KvDtype;
use engine_worker::model::default_aux_layers;
use engine_worker::model::{LoadFormat, Model, WeightType};

#[derive(Debug, Parser)]
struct Args {
    /// The target model (GGUF file or Hugging Face directory).
    #[arg(long, env = "SPECULA_MODEL", default_value = vocab::DEFAULT_MODEL_PATH)]
    model: PathBuf,
    /// JSON lines with `cid`, `prompt_ids`, `output_ids`.
    #[arg(long)]
    input: PathBuf,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Layers whose incoming hidden state is kept (default EAGLE-3's: 2, N/2, N-3).
    #[arg(long, value_delimiter = ',')]
    layers: Vec<usize>,
    /// Longest sequence kept (prompt and output together; longer ones are cut).
    #[arg(long, default_value_t = 2048)]
    max_len: usize,
    /// Tokens per forward.
    #[arg(long, default_value_t = 512)]
    chunk: usize,
    /// Forward-pass threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(serde::Deserialize)]
struct Record {
    cid: serde_json::Value,
    prompt_ids: Vec<u32>,
    output_ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
struct Indexed {
    cid: serde_json::Value,
    offset: u64,
    len: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = Model::load(&args.model, LoadFormat::Auto, WeightType::F32, 0)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let cfg = model.config.clone();
    let layers = match args.layers.is_empty() {
        true => default_aux_layers(cfg.num_layers),
        false => args.layers.clone(),
    };
    let block_size = 16;
    let mut options = CpuBackendOptions::new(args.max_len.div_ceil(block_size));
    options.threads = args.threads;
    options.kv_dtype = KvDtype::F32;
    std::fs::create_dir_all(&args.out)?;
    write_target(&args.out, &model)?;
    let mut backend = CpuBackend::new(model, options)?;
    backend.capture_hidden(&layers)?;
    let table: Vec<u32> = (0..backend.num_blocks() as u32).collect();
    let width = layers.len() * cfg.hidden_size;

    let meta = serde_json::json!({
        "model": cfg.name, "layers": layers, "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers, "vocab_size": cfg.vocab_size, "dtype": "f16",
    });
    std::fs::write(
        args.out.join("meta.json"),
        serde_json::to_string_pretty(&meta)?,
    )?;
    let (done, rows) = resume(&args.out, width)?;
    let mut data = BufWriter::new(
        OpenOptions::new()
            .append(true)
            .open(args.out.join("hidden.f16"))?,
    );
    let mut index = OpenOptions::new()
        .append(true)
        .create(true)
        .open(args.out.join("index.jsonl"))?;
    let mut offset = rows;
    let started = std::time::Instant::now();
    let mut new_tokens = 0usize;
    for line in BufReader::new(File::open(&args.input)?).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: Record = serde_json::from_str(&line).context("an input line")?;
        if done.contains(&rec.cid.to_string()) {
            continue;
        }
        let mut tokens = rec.prompt_ids.clone();
        tokens.extend_from_slice(&rec.output_ids);
        tokens.truncate(args.max_len);
        if tokens.len() < 2 {
            continue;
        }
        let mut buf = Vec::with_capacity(width * 2);
        for start in (0..tokens.len()).step_by(args.chunk) {
            let end = (start + args.chunk).min(tokens.len());
            let fwd = SeqForward::new(&tokens[start..end], start, &table, LogitsFor::Last);
            backend.forward(&[fwd])?;
            let hidden = backend.take_hidden(); // [end - start, width]
            if hidden.len() != (end - start) * width {
                bail!(
                    "captured {} values for {} tokens",
                    hidden.len(),
                    end - start
                );
            }
            buf.clear();
            for v in hidden {
                buf.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
            data.write_all(&buf)?;
        }
        data.flush()?;
        let entry = serde_json::json!({
            "cid": rec.cid, "offset": offset, "len": tokens.len(),
            "prompt_len": rec.prompt_ids.len().min(tokens.len()), "tokens": tokens,
        });
        writeln!(index, "{entry}")?;
        offset += tokens.len() as u64;
        new_tokens += tokens.len();
    }
    eprintln!(
        "dump-hidden: {new_tokens} new positions in {:.0} s ({:.0}/s); {offset} in all",
        started.elapsed().as_secs_f64(),
        new_tokens as f64 / started.elapsed().as_secs_f64().max(1e-9)
    );
    Ok(())
}

/// The target's hyper-parameters, embedding and final norm, for the trainer.
fn write_target(out: &std::path::Path, model: &Model) -> anyhow::Result<()> {
    let c = &model.config;
    let config = serde_json::json!({
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "vocab_size": c.vocab_size, "num_hidden_layers": c.num_layers,
        "max_position_embeddings": c.max_position_embeddings, "name": c.name,
    });
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config)?,
    )?;
    let mut embed = Vec::with_capacity(c.vocab_size * c.hidden_size * 2);
    let mut row = vec![0f32; c.hidden_size];
    for t in 0..c.vocab_size {
        model.weights.embed.dequantize_row(t, &mut row);
        row.iter()
            .for_each(|v| embed.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes()));
    }
    let norm: Vec<u8> = model
        .weights
        .final_norm
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let views = [
        (
            "embed_tokens.weight",
            TensorView::new(Dtype::F16, vec![c.vocab_size, c.hidden_size], &embed)?,
        ),
        (
            "norm.weight",
            TensorView::new(Dtype::F32, vec![c.hidden_size], &norm)?,
        ),
    ];
    safetensors::serialize_to_file(views, None, &out.join("target.safetensors"))?;
    Ok(())
}

/// The sequences already written and the rows they take; cuts off any rows past them.
fn resume(out: &std::path::Path, width: usize) -> anyhow::Result<(HashSet<String>, u64)> {
    let mut done = HashSet::new();
    let mut rows = 0u64;
    let mut kept = String::new();
    if let Ok(f) = File::open(out.join("index.jsonl")) {
        for line in BufReader::new(f).lines() {
            let line = line?;
            let Ok(entry) = serde_json::from_str::<Indexed>(&line) else {
                break; // a line cut by a stopped run, the last one
            };
            done.insert(entry.cid.to_string());
            rows = rows.max(entry.offset + entry.len);
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    std::fs::write(out.join("index.jsonl"), kept)?;
    let data = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(out.join("hidden.f16"))?;
    data.set_len(rows * (width * 2) as u64)?;
    Ok((done, rows))
}
