//! Structured-output benchmark: what llguidance's masks cost on the default model's
//! vocabulary. Per schema, the compile time and, walking a valid document token by token (in
//! the vocabulary's longest tokens), the time to compute each position's mask, and how many
//! positions the schema forces (a single allowed token: drafted for free). Output: one Markdown
//! table row per schema. With `--features outlines`, outlines-core's index is built for the
//! same schemas and vocabulary and timed beside it (its construction, then its per-position
//! lookups while walking the same documents).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use grammar::{Compiler, Constraint, GrammarLimits};

#[derive(Debug, Parser)]
struct Args {
    /// GGUF model file whose vocabulary the grammars compile over.
    #[arg(long, env = "SPECULA_MODEL", default_value = vocab::DEFAULT_MODEL_PATH)]
    model: PathBuf,
    /// Times each document is walked.
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// llguidance's lexer fuel per mask (default: the product's, `GrammarLimits`).
    #[arg(long)]
    step_lexer_fuel: Option<u64>,
    /// llguidance's Earley items per mask.
    #[arg(long)]
    step_max_items: Option<usize>,
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

/// An object whose one field takes one of `n` distinct words: what a request that lists, say,
/// every product name sends, and the costliest kind of schema measured here.
fn large_enum(n: usize) -> (String, String, String) {
    let (schema, words) = grammar::samples::large_enum(n);
    let document = format!("{{\"choice\": \"{}\"}}", words[n / 2]);
    (format!("enum of {n} words"), schema.to_string(), document)
}

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
    let defaults = GrammarLimits::default();
    let limits = GrammarLimits {
        step_lexer_fuel: args.step_lexer_fuel.unwrap_or(defaults.step_lexer_fuel),
        step_max_items: args.step_max_items.unwrap_or(defaults.step_max_items),
        ..defaults
    };
    let compiler = Compiler::with_limits(&vocab, model.config.vocab_size, eos, limits)?;
    println!(
        "vocabulary: {} tokens, indexed in {:.1} ms",
        model.config.vocab_size,
        started.elapsed().as_secs_f64() * 1e3
    );
    println!("| schema | compile ms | tokens | mask µs mean | mask µs p99 | forced positions |");
    println!("|---|---|---|---|---|---|");
    let enums: Vec<(String, String, String)> = [500usize, 2000, 4000]
        .iter()
        .map(|&n| large_enum(n))
        .collect();
    let cases = CASES.iter().map(|&(n, s, d)| (n, s, d)).chain(
        enums
            .iter()
            .map(|(n, s, d)| (n.as_str(), s.as_str(), d.as_str())),
    );
    for (name, schema, document) in cases {
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
                let mask = match g.draft_masks(&[]) {
                    Ok(mut masks) => masks.remove(0),
                    Err(error) => {
                        println!("| {name} | mask failed: {error} |");
                        break;
                    }
                };
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
    #[cfg(feature = "outlines")]
    outlines::compare(&vocab, model.config.vocab_size, eos, &compiler)?;
    Ok(())
}

#[cfg(feature = "outlines")]
mod outlines {
    use std::time::Instant;

    use outlines_core::prelude::{Index, Vocabulary};

    use super::CASES;

    /// outlines-core: the index over schema and vocabulary is built before the first token;
    /// each position then costs a lookup.
    pub fn compare(
        tokens: &vocab::TokenBytes,
        vocab_size: usize,
        eos: u32,
        compiler: &grammar::Compiler,
    ) -> anyhow::Result<()> {
        let mut vocabulary = Vocabulary::new(eos);
        for id in 0..vocab_size as u32 {
            let bytes = tokens.get(id);
            if id != eos && !tokens.is_control(id) && !bytes.is_empty() {
                vocabulary.try_insert(bytes.to_vec(), id)?;
            }
        }
        println!();
        println!("outlines-core (the version Cargo.lock pins):");
        println!("| schema | index build ms | index states | lookup µs mean | tokens walked |");
        println!("|---|---|---|---|---|");
        for &(name, schema, document) in CASES.iter().filter(|c| !c.1.is_empty()) {
            let regex = outlines_core::json_schema::regex_from_str(schema, None, None)?;
            let started = Instant::now();
            let index = Index::new(&regex, &vocabulary)?;
            let build_ms = started.elapsed().as_secs_f64() * 1e3;
            // outlines writes `{"a":1}` unless told otherwise: walk its compact form.
            let compact: serde_json::Value = serde_json::from_str(document)?;
            let walk = compiler.greedy_tokens(compact.to_string().as_bytes());
            let mut state = index.initial_state();
            let mut walked = 0;
            let started = Instant::now();
            for t in &walk {
                let allowed = index.allowed_tokens(&state).unwrap_or_default();
                std::hint::black_box(&allowed);
                match index.next_state(&state, t) {
                    Some(next) => state = next,
                    None => break,
                }
                walked += 1;
            }
            let lookup_us = started.elapsed().as_secs_f64() * 1e6 / walked.max(1) as f64;
            println!(
                "| {name} | {build_ms:.0} | {} | {lookup_us:.1} | {walked} of {} |",
                index.transitions().len(),
                walk.len()
            );
        }
        Ok(())
    }
}
