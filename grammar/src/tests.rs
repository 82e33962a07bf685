use super::*;
use vocab::{Entry, VocabKind};

/// Every byte as a token, a few longer tokens, and EOS: small enough to reason about.
fn compiler() -> (Compiler, Vec<String>) {
    let mut texts: Vec<String> = (0u8..=127).map(|b| (b as char).to_string()).collect();
    texts.extend(["{\"", "\": ", "true", "name", "\"}"].map(String::from));
    texts.push("<|eos|>".into());
    let eos = (texts.len() - 1) as u32;
    let entries = texts
        .iter()
        .enumerate()
        .map(|(id, t)| match id as u32 == eos {
            true => Entry::Control(t),
            false => Entry::UserDefined(t),
        });
    let bytes = TokenBytes::from_entries(entries, VocabKind::ByteLevel);
    (Compiler::new(&bytes, texts.len(), eos).unwrap(), texts)
}

/// An object with exactly one boolean field, `name`.
const NAME_FLAG: &str = r#"{"type": "object", "properties": {"name": {"type": "boolean"}},
    "required": ["name"], "additionalProperties": false}"#;

fn ids(texts: &[String], pieces: &[&str]) -> Vec<u32> {
    pieces
        .iter()
        .map(|p| texts.iter().position(|t| t == p).unwrap() as u32)
        .collect()
}

#[test]
fn a_json_object_starts_with_a_brace_and_ends_with_eos() {
    let (compiler, texts) = compiler();
    let mut g = compiler.compile(&Constraint::JsonObject).unwrap();
    let first = &g.draft_masks(&[]).unwrap()[0];
    let brace = ids(&texts, &["{"])[0];
    assert!(first.allows(brace));
    assert!(
        !first.allows(ids(&texts, &["x"])[0]),
        "text before the object"
    );
    let out = ids(&texts, &["{\"", "a", "\": ", "1", "}"]);
    g.accept(&out).unwrap();
    let eos = (texts.len() - 1) as u32;
    let after = &g.draft_masks(&[]).unwrap()[0];
    assert!(after.allows(eos), "a complete object may end");
    assert_eq!(
        after.count(),
        1,
        "nothing may follow a complete object but EOS"
    );
}

#[test]
fn draft_masks_follow_the_drafts_the_grammar_allows_and_leave_the_state() {
    let (compiler, texts) = compiler();
    let mut g = compiler
        .compile(&Constraint::JsonSchema(NAME_FLAG.into()))
        .unwrap();
    let good = ids(&texts, &["{\"", "name", "\": ", "true", "}"]);
    let masks = g.draft_masks(&good).unwrap();
    assert_eq!(masks.len(), good.len() + 1);
    for (mask, &t) in masks.iter().zip(&good) {
        assert!(mask.allows(t));
    }
    // A draft the schema rules out ends the walk: its row is the last one scored.
    let bad = ids(&texts, &["{\"", "x"]);
    let masks = g.draft_masks(&bad).unwrap();
    assert_eq!(masks.len(), 2);
    assert!(!masks[1].allows(bad[1]));
    // The walks left the grammar at the start: the good drafts are accepted from there.
    g.accept(&good).unwrap();
    assert!(g.is_finished() || g.draft_masks(&[]).unwrap()[0].count() == 1);
}

#[test]
fn forced_text_is_drafted() {
    let (compiler, texts) = compiler();
    let mut g = compiler
        .compile(&Constraint::JsonSchema(NAME_FLAG.into()))
        .unwrap();
    // The only object this schema allows starts `{"name": `.
    let forced = g.forced();
    let text: String = forced.iter().map(|&t| texts[t as usize].as_str()).collect();
    assert!(text.starts_with("{\"name\": "), "{text:?}");
}

#[test]
fn schemas_that_cannot_be_served_are_refused_with_the_reason() {
    let (compiler, _) = compiler();
    let err = |s: &str| {
        compiler
            .compile(&Constraint::JsonSchema(s.into()))
            .unwrap_err()
    };
    assert!(matches!(err("{not json"), GrammarError::NotJson { .. }));
    assert!(matches!(err("[1, 2]"), GrammarError::Compile { .. }));
    assert!(matches!(
        err(r#"{"type": "no-such-type"}"#),
        GrammarError::Compile { .. }
    ));
    let huge = format!(r#"{{"description": "{}"}}"#, "x".repeat(MAX_SCHEMA_BYTES));
    assert!(matches!(err(&huge), GrammarError::TooLarge { .. }));
}
