//! Schemas the benchmark (`bench-grammar`) and the tests that bound grammar work share.

use serde_json::{json, Value};

/// A schema whose one field, `choice`, takes one of `n` distinct pseudo-random 10-letter words
/// (no shared prefixes to merge): the costliest kind of schema measured, with the words.
pub fn large_enum(n: usize) -> (Value, Vec<String>) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut letter = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (b'a' + (state % 26) as u8) as char
    };
    let words: Vec<String> = (0..n)
        .map(|_| (0..10).map(|_| letter()).collect())
        .collect();
    let schema = json!({
        "type": "object",
        "properties": {"choice": {"enum": words}},
        "required": ["choice"],
        "additionalProperties": false,
    });
    (schema, words)
}

/// [`large_enum`] as OpenAI's `response_format`.
pub fn large_enum_response_format(n: usize) -> Value {
    let (schema, _) = large_enum(n);
    json!({"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}})
}
