//! Text that must stay text: chat message content is tokenized without matching special
//! tokens, so a user who writes `<|im_start|>system` gets those characters, not a forged turn.
//!
//! The chat template renders the content with the template's own special tokens around it, and
//! the rendered prompt is tokenized in one piece. To tell the two apart after rendering, every
//! special-token literal inside message content is wrapped in two Unicode noncharacters
//! ([`OPEN`], [`CLOSE`]) before the template sees it; [`QuotedText::encode`] then encodes the
//! wrapped spans as plain text and the rest as before. Only the literals are wrapped, not the
//! whole content, so a template that trims or edits content still renders the same text.

use aho_corasick::{AhoCorasick, MatchKind};

/// Starts a span of user text that looks like a special token (a Unicode noncharacter: never
/// assigned, for a program's internal use).
const OPEN: char = '\u{FDD0}';
/// Ends that span.
const CLOSE: char = '\u{FDD1}';

/// The special-token literals of a vocabulary and an encoder that treats them as text.
pub struct QuotedText {
    /// Every special added token's content; none when the vocabulary has none.
    literals: Option<AhoCorasick>,
    /// The tokenizer with special-token matching off (`encode_special_tokens`).
    as_text: tokenizers::Tokenizer,
}

impl QuotedText {
    pub fn new(inner: &tokenizers::Tokenizer) -> Self {
        let specials: Vec<String> = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|token| token.special && !token.content.is_empty())
            .map(|token| token.content)
            .collect();
        let literals = (!specials.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&specials)
                .expect("special token literals build an automaton")
        });
        let mut as_text = inner.clone();
        as_text.set_encode_special_tokens(true);
        Self { literals, as_text }
    }

    /// `content` with each special-token literal marked as text, and any marker characters the
    /// client sent replaced by U+FFFD (so a client cannot open or close a span).
    pub fn quote(&self, content: &str) -> String {
        let content = content.replace([OPEN, CLOSE], "\u{FFFD}");
        let Some(literals) = &self.literals else {
            return content;
        };
        let mut out = String::with_capacity(content.len());
        let mut last = 0;
        for m in literals.find_iter(&content) {
            out.push_str(&content[last..m.start()]);
            out.push(OPEN);
            out.push_str(&content[m.start()..m.end()]);
            out.push(CLOSE);
            last = m.end();
        }
        out.push_str(&content[last..]);
        out
    }

    /// Encodes rendered text: marked spans as plain text, the rest with special tokens matched.
    pub fn encode(
        &self,
        inner: &tokenizers::Tokenizer,
        text: &str,
    ) -> tokenizers::Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut inside = false;
        let mut rest = text;
        while !rest.is_empty() {
            // A template that cuts content could leave a marker unpaired: the state follows
            // the markers as they come, so at worst the client's own text stays text.
            let end = rest.find([OPEN, CLOSE]).unwrap_or(rest.len());
            let piece = &rest[..end];
            if !piece.is_empty() {
                let encoder = if inside { &self.as_text } else { inner };
                ids.extend_from_slice(encoder.encode_fast(piece, false)?.get_ids());
            }
            let Some(marker) = rest[end..].chars().next() else {
                break;
            };
            inside = marker == OPEN;
            rest = &rest[end + marker.len_utf8()..];
        }
        Ok(ids)
    }
}
