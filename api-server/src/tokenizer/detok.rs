//! Incremental detokenization of one output: tokens arrive a few at a time, text leaves as soon
//! as it is safe to show. Never emits half a UTF-8 character, and holds back the tail that could
//! still turn into a stop string, so a stop string (and anything after it) is never returned.

use std::sync::Arc;

use vocab::StopStrings;

use super::Tokenizer;

/// Decoder state of one choice.
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    /// Bytes of an unfinished UTF-8 character.
    pending: Vec<u8>,
    /// All text decoded so far (cut at a stop string once one is seen).
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    /// Bytes of `text` already searched for stop strings.
    checked: usize,
    stops: StopStrings,
    matched_stop: Option<String>,
    tokens_seen: usize,
}

impl IncrementalDecoder {
    pub fn new(tokenizer: Arc<Tokenizer>, stops: Vec<String>) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
            text: String::new(),
            emitted: 0,
            checked: 0,
            stops: StopStrings::new(stops),
            matched_stop: None,
            tokens_seen: 0,
        }
    }

    /// The tokenizer it decodes with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The stop string that ended the text, once one has.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched_stop.as_deref()
    }

    /// Tokens pushed before the text stopped (the completion's delivered tokens).
    pub fn tokens_seen(&self) -> usize {
        self.tokens_seen
    }

    /// Adds tokens; returns the text that became safe to show. After a stop string, ignores
    /// everything.
    pub fn push(&mut self, tokens: &[u32]) -> String {
        if self.matched_stop.is_some() {
            return String::new();
        }
        for &id in tokens {
            self.tokens_seen += 1;
            if self.tokenizer.is_special(id) {
                continue;
            }
            if let Some(bytes) = self.tokenizer.token_bytes(id) {
                self.pending.extend_from_slice(bytes);
            }
            self.drain_complete_chars();
            if self.check_stop() {
                break;
            }
        }
        let safe = if self.matched_stop.is_some() {
            self.text.len()
        } else {
            self.stops.releasable_len(&self.text)
        };
        self.take_until(safe)
    }

    /// Ends the output: flushes an unfinished character (as U+FFFD) and returns the rest.
    pub fn finish(&mut self) -> String {
        if self.matched_stop.is_none() && !self.pending.is_empty() {
            let rest = std::mem::take(&mut self.pending);
            self.text.push_str(&String::from_utf8_lossy(&rest));
            self.check_stop();
        }
        self.take_until(self.text.len())
    }

    /// Whole decoded text so far (for non-streaming responses, after `finish`).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn take_until(&mut self, end: usize) -> String {
        if end <= self.emitted {
            return String::new();
        }
        let out = self.text[self.emitted..end].to_owned();
        self.emitted = end;
        out
    }

    /// Moves every complete character from `pending` to `text`; invalid bytes become U+FFFD.
    fn drain_complete_chars(&mut self) {
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: the prefix was just validated.
                    self.text
                        .push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or(""));
                    match e.error_len() {
                        // An unfinished character: wait for its next bytes.
                        None => {
                            self.pending.drain(..valid);
                            return;
                        }
                        Some(bad) => {
                            self.text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Cuts `text` at the earliest stop string the text added since the last check completes.
    fn check_stop(&mut self) -> bool {
        if self.stops.is_empty() {
            return false;
        }
        let found = self.stops.find_completed(&self.text, self.checked);
        self.checked = self.text.len();
        match found {
            Some(hit) => {
                self.matched_stop = Some(self.stops.get(hit).to_owned());
                self.text.truncate(hit.at.max(self.emitted));
                self.pending.clear();
                true
            }
            None => false,
        }
    }
}
