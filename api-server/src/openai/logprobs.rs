//! Logprobs in OpenAI's two shapes: chat's `logprobs.content` (one object per token, with its
//! bytes and `top_logprobs`) and completions' legacy columns (`tokens`, `token_logprobs`,
//! `top_logprobs`, `text_offset`). Both are rendered from [`LogprobEntry`]s, which carry each
//! token's text already (see [`render`]).

use std::collections::BTreeMap;

use proto::TokenLogprob;
use serde::{Serialize, Serializer};

use crate::tokenizer::Tokenizer;

/// What OpenAI and vLLM write for a token the processors ruled out (`-inf` is not JSON).
const MIN_LOGPROB: f32 = -9999.0;

/// One token's text, bytes and logprob.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// One emitted token's logprob and its alternatives, rendered, with where its text starts in
/// the choice's text (in characters, as vLLM counts `text_offset`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    pub chosen: TokenInfo,
    pub top: Vec<TokenInfo>,
    pub text_offset: usize,
    /// False for an echoed prompt's first token, which nothing before it predicts: its
    /// logprob and alternatives are written as null.
    pub scored: bool,
}

/// How tokens are named: by their text, or as `token_id:<id>` (vLLM's
/// `return_tokens_as_token_ids`, for clients that need the ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenNames {
    Text,
    Ids,
}

fn info(tokenizer: &Tokenizer, names: TokenNames, id: u32, logprob: f32) -> TokenInfo {
    let bytes = tokenizer.token_bytes(id).unwrap_or_default().to_vec();
    let token = match names {
        TokenNames::Text => String::from_utf8_lossy(&bytes).into_owned(),
        TokenNames::Ids => format!("token_id:{id}"),
    };
    TokenInfo {
        token,
        bytes,
        logprob: logprob.max(MIN_LOGPROB),
    }
}

/// Renders the engine's logprobs of `tokens` (one each); `text_offset` is where the first
/// token's text starts and is advanced past the last one's (by its text, whatever the names).
pub fn render(
    tokenizer: &Tokenizer,
    names: TokenNames,
    tokens: &[u32],
    logprobs: &[TokenLogprob],
    text_offset: &mut usize,
) -> Vec<LogprobEntry> {
    tokens
        .iter()
        .zip(logprobs)
        .map(|(&id, lp)| {
            let chosen = info(tokenizer, names, id, lp.logprob);
            let entry = LogprobEntry {
                top: lp
                    .top
                    .iter()
                    .map(|&(alt, logprob)| info(tokenizer, names, alt, logprob))
                    .collect(),
                text_offset: *text_offset,
                chosen,
                scored: true,
            };
            *text_offset += String::from_utf8_lossy(&entry.chosen.bytes).chars().count();
            entry
        })
        .collect()
}

/// An echoed prompt's entries: its first token unscored, then one per `logprobs` entry (the
/// engine's prompt logprobs, one per prompt token after the first). Advances `text_offset` as
/// [`render`] does.
pub fn render_prompt(
    tokenizer: &Tokenizer,
    names: TokenNames,
    prompt: &[u32],
    logprobs: &[TokenLogprob],
    text_offset: &mut usize,
) -> Vec<LogprobEntry> {
    let Some((&first, rest)) = prompt.split_first() else {
        return Vec::new();
    };
    // Its logprob is never written (`scored` is false).
    let first = info(tokenizer, names, first, 0.0);
    let entry = LogprobEntry {
        text_offset: *text_offset,
        chosen: first,
        top: Vec::new(),
        scored: false,
    };
    *text_offset += String::from_utf8_lossy(&entry.chosen.bytes).chars().count();
    let mut entries = vec![entry];
    entries.extend(render(tokenizer, names, rest, logprobs, text_offset));
    entries
}

/// Chat's `logprobs`: `{"content": [...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    pub fn new(entries: &[LogprobEntry]) -> Self {
        let top = |t: &TokenInfo| ChatTopLogprob {
            token: t.token.clone(),
            logprob: t.logprob,
            bytes: t.bytes.clone(),
        };
        Self {
            content: entries
                .iter()
                .map(|e| ChatTokenLogprob {
                    token: e.chosen.token.clone(),
                    logprob: e.chosen.logprob,
                    bytes: e.chosen.bytes.clone(),
                    top_logprobs: e.top.iter().map(top).collect(),
                })
                .collect(),
        }
    }
}

/// Completions' `logprobs`: four columns, one entry per token.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionLogprobs {
    pub text_offset: Vec<usize>,
    /// Null for an echoed prompt's first token.
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    /// Per token, the chosen token and the `logprobs` most likely ones, by text; null for an
    /// echoed prompt's first token.
    pub top_logprobs: Vec<Option<TopMap>>,
}

/// `{token text: logprob}` in the order the engine ranked them (a token whose text repeats one
/// before keeps the first).
#[derive(Debug, Clone)]
pub struct TopMap(Vec<(String, f32)>);

impl Serialize for TopMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

impl CompletionLogprobs {
    pub fn new(entries: &[LogprobEntry]) -> Self {
        let top = |e: &LogprobEntry| {
            if !e.scored {
                return None;
            }
            let mut seen = BTreeMap::new();
            let mut list = Vec::with_capacity(e.top.len() + 1);
            for t in e.top.iter().chain([&e.chosen]) {
                if seen.insert(t.token.clone(), ()).is_none() {
                    list.push((t.token.clone(), t.logprob));
                }
            }
            Some(TopMap(list))
        };
        Self {
            text_offset: entries.iter().map(|e| e.text_offset).collect(),
            token_logprobs: (entries.iter())
                .map(|e| e.scored.then_some(e.chosen.logprob))
                .collect(),
            tokens: entries.iter().map(|e| e.chosen.token.clone()).collect(),
            top_logprobs: entries.iter().map(top).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: &str, logprob: f32, top: &[(&str, f32)], offset: usize) -> LogprobEntry {
        let info = |t: &str, l: f32| TokenInfo {
            token: t.into(),
            bytes: t.as_bytes().to_vec(),
            logprob: l,
        };
        LogprobEntry {
            chosen: info(token, logprob),
            top: top.iter().map(|&(t, l)| info(t, l)).collect(),
            text_offset: offset,
            scored: true,
        }
    }

    #[test]
    fn both_shapes_are_written_as_openai_does() {
        let entries = [
            entry(" a", -0.5, &[(" a", -0.5), (" b", -1.0)], 3),
            entry("!", -2.0, &[(" c", -0.25)], 5),
        ];
        let chat = serde_json::to_value(ChatLogprobs::new(&entries)).unwrap();
        assert_eq!(
            chat["content"][1],
            serde_json::json!({"token": "!", "logprob": -2.0, "bytes": [33],
                "top_logprobs": [{"token": " c", "logprob": -0.25, "bytes": [32, 99]}]})
        );
        let completion = serde_json::to_value(CompletionLogprobs::new(&entries)).unwrap();
        assert_eq!(
            completion,
            serde_json::json!({"text_offset": [3, 5], "token_logprobs": [-0.5, -2.0],
                "tokens": [" a", "!"],
                "top_logprobs": [{" a": -0.5, " b": -1.0}, {" c": -0.25, "!": -2.0}]})
        );
        // An echoed prompt's first token: nothing predicts it.
        let mut first = entry("Hi", 0.0, &[], 0);
        first.scored = false;
        let completion = serde_json::to_value(CompletionLogprobs::new(&[first])).unwrap();
        assert_eq!(
            completion,
            serde_json::json!({"text_offset": [0], "token_logprobs": [null],
                "tokens": ["Hi"], "top_logprobs": [null]})
        );
    }
}
