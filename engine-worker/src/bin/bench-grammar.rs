//! Structured-output benchmark: what llguidance's masks cost on the default model's
//! vocabulary. Per schema, the compile time and, walking a valid document token by token (in
//! the vocabulary's longest tokens), the time to compute each position's mask, and how many
//! positions the schema forces (a single allowed token: drafted for free). Output: one Markdown
//! table row per schema.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use grammar::{Compiler, Constraint};

#[derive(Debug, Parser)]
struct Args {
    /// GGUF model file whose vocabulary the grammars compile over.
    #[arg(long, env = "SPECULA_MODEL", default_value = vocab::DEFAULT_MODEL_PATH)]
    model: PathBuf,
    /// Times each document is walked.
    #[arg(long, default_value_t = 20)]
    repeats: usize,
}

/// (name, schema, a document that satisfies it, in the compact form the grammar writes)
const CASES: &[(&str, &str, &str)] = &[
    (
        "json_object",
        "",
        r#"{"city": "Paris", "country": "France", "population": 2148000}"#,
    ),
    (
        "person",
        r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "maxLength": 40},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
            "required": ["name", "age", "email", "tags"], "additionalProperties": false}"#,
        r#"{"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "poetry"]}"#,
    ),
    (
        "order (nested)",
        r#"{"type": "object", "properties": {"order": {"type": "object", "properties": {
            "id": {"type": "integer"}, "items": {"type": "array", "items": {"type": "object",
            "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            "required": ["sku", "qty"], "additionalProperties": false}}},
            "required": ["id", "items"], "additionalProperties": false},
            "total": {"type": "number"}}, "required": ["order", "total"],
            "additionalProperties": false}"#,
        r#"{"order": {"id": 1042, "items": [{"sku": "A-17", "qty": 2}, {"sku": "B-3", "qty": 1}]}, "total": 59.5}"#,
    ),
    (
        "enums",
        r#"{"type": "object", "properties": {"size": {"enum": ["small", "medium", "large"]},
            "color": {"enum": ["red", "green", "blue"]}, "in_stock": {"type": "boolean"}},
            "required": ["size", "color", "in_stock"], "additionalProperties": false}"#,
        r#"{"size": "medium", "color": "green", "in_stock": true}"#,
    ),
];

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = engine_worker::model::load_gguf(&args.model)?;
    let vocab = model
        .tokenizer
        .as_ref()
        .context("the model file has no vocabulary")?
        .token_bytes();
    let eos = *model.config.eos_token_ids.first().unwrap_or(&0);
    let started = Instant::now();
    let compiler = Compiler::new(&vocab, model.config.vocab_size, eos)?;
    println!(
        "vocabulary: {} tokens, indexed in {:.1} ms",
        model.config.vocab_size,
        started.elapsed().as_secs_f64() * 1e3
    );
    println!("| schema | compile ms | tokens | mask µs mean | mask µs p99 | forced positions |");
    println!("|---|---|---|---|---|---|");
    for &(name, schema, document) in CASES {
        let constraint = match schema {
            "" => Constraint::JsonObject,
            s => Constraint::JsonSchema(s.to_owned()),
        };
        let tokens = compiler.greedy_tokens(document.as_bytes());
        let started = Instant::now();
        let mut g = compiler.compile(&constraint)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut mask_us = Vec::new();
        let mut forced = 0;
        for repeat in 0..args.repeats {
            if repeat > 0 {
                g = compiler.compile(&constraint)?;
            }
            for &t in &tokens {
                let started = Instant::now();
                let mask = g.draft_masks(&[])?.remove(0);
                mask_us.push(started.elapsed().as_secs_f64() * 1e6);
                anyhow::ensure!(
                    mask.allows(t),
                    "{name}: the document's token {t} is ruled out"
                );
                if repeat == 0 && mask.count() == 1 {
                    forced += 1;
                }
                g.accept(&[t])?;
            }
        }
        mask_us.sort_by(f64::total_cmp);
        let mean = mask_us.iter().sum::<f64>() / mask_us.len() as f64;
        let p99 = mask_us[(mask_us.len() * 99 / 100).min(mask_us.len() - 1)];
        println!(
            "| {name} | {compile_ms:.2} | {} | {mean:.0} | {p99:.0} | {forced} |",
            tokens.len()
        );
    }
    Ok(())
}
