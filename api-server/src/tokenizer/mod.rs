//! Text ⇄ token ids for one model: a byte-level BPE built from the GGUF `tokenizer.ggml.*`
//! fields ([`gguf`](self::gguf)) or loaded from an HF `tokenizer.json` ([`hf`]), plus the raw
//! bytes of every token so output can be decoded incrementally ([`detok`]).

pub mod detok;
pub mod gguf;
pub mod hf;
pub mod quoted;

use vocab::TokenBytes;

use crate::error::ApiError;
use quoted::QuotedText;

/// A loaded tokenizer. Encoding goes through the `tokenizers` crate; decoding uses each token's
/// raw bytes, which is what the engine-worker matches stop strings on too.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The bytes of every id, by the rule the engine-worker uses too.
    token_bytes: TokenBytes,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    bos_policy: BosPolicy,
    /// Chat content's special-token literals, encoded as text.
    quoted: QuotedText,
    /// The longest token's bytes: text longer than `n` times this cannot be `n` tokens.
    max_token_bytes: usize,
    /// Built on the first structured-output request (indexing the vocabulary takes a while).
    grammars: std::sync::OnceLock<Option<grammar::Compiler>>,
}

/// How a completion prompt gets its BOS token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BosPolicy {
    Never,
    /// Prepend `bos_id` (GGUF `tokenizer.ggml.add_bos_token`).
    Prepend,
    /// Let the HF post-processor add whatever special tokens it defines.
    PostProcessor,
}

impl Tokenizer {
    pub(crate) fn from_parts(
        inner: tokenizers::Tokenizer,
        token_bytes: TokenBytes,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        bos_policy: BosPolicy,
    ) -> Self {
        let max_token_bytes = (0..token_bytes.len() as u32)
            .map(|id| {
                // A special token's literal text is one token too.
                let literal = token_bytes.literal(id).map_or(0, <[u8]>::len);
                token_bytes.get(id).len().max(literal)
            })
            .max()
            .unwrap_or(1)
            .max(1);
        Self {
            quoted: QuotedText::new(&inner),
            max_token_bytes,
            inner,
            token_bytes,
            bos_id,
            eos_id,
            bos_policy,
            grammars: std::sync::OnceLock::new(),
        }
    }

    /// Compiles `response_format` constraints over this vocabulary, to refuse a schema that
    /// cannot be served before the request is admitted (the worker compiles its own). None for
    /// a model without an end-of-sequence token.
    pub fn grammars(&self) -> Option<&grammar::Compiler> {
        self.grammars
            .get_or_init(|| {
                let eos = self.eos_id?;
                grammar::Compiler::new(&self.token_bytes, self.token_bytes.len(), eos)
                    .inspect_err(|error| {
                        tracing::warn!(%error, "structured output is off for this vocabulary")
                    })
                    .ok()
            })
            .as_ref()
    }

    /// Whether `text` is certainly more than `tokens` tokens, known without encoding it.
    pub fn exceeds_tokens(&self, text: &str, tokens: usize) -> bool {
        text.len() > tokens.saturating_mul(self.max_token_bytes)
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Text of a token id (special tokens as written), for the chat template's context.
    pub fn token_text(&self, id: u32) -> Option<String> {
        let bytes = self.token_bytes.literal(id)?;
        Some(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Encodes text as is: special tokens in the text are matched whole, nothing is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        let encoding = self.inner.encode_fast(text, false).map_err(encode_failed)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes a completion prompt: as [`encode`](Self::encode), with BOS first when the model
    /// asks for it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        match (self.bos_policy, self.bos_id) {
            (BosPolicy::Prepend, Some(bos)) => Ok(with_bos(self.encode(text)?, bos)),
            (BosPolicy::PostProcessor, _) => {
                let encoding = self.inner.encode_fast(text, true).map_err(encode_failed)?;
                Ok(encoding.get_ids().to_vec())
            }
            _ => self.encode(text),
        }
    }

    /// Chat message content as the template should see it: special-token literals marked so
    /// that [`encode_chat`](Self::encode_chat) encodes them as text ([`quoted`]).
    pub fn quote_content(&self, content: &str) -> String {
        self.quoted.quote(content)
    }

    /// Encodes a rendered chat prompt: the template's special tokens matched, the messages'
    /// text as text; with `add_special`, BOS first when the model asks for it.
    pub fn encode_chat(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ApiError> {
        let ids = self
            .quoted
            .encode(&self.inner, text)
            .map_err(encode_failed)?;
        Ok(match (add_special, self.bos_id, self.bos_policy) {
            (true, Some(bos), BosPolicy::Prepend | BosPolicy::PostProcessor) => with_bos(ids, bos),
            _ => ids,
        })
    }

    /// The tokenizer as an HF `tokenizer.json` document (e.g. to export a GGUF's tokenizer).
    pub fn to_hf_json(&self) -> Result<String, ApiError> {
        self.inner
            .to_string(false)
            .map_err(|e| ApiError::ModelLoad {
                what: "tokenizer.json".into(),
                reason: e.to_string(),
            })
    }

    /// Raw bytes of one token (a special token's literal text), or `None` for an id outside
    /// the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.literal(id)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.token_bytes.is_control(id)
    }

    /// Decodes ids to text (invalid UTF-8 becomes U+FFFD); unknown ids are skipped.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            if let Some(b) = self.token_bytes(id) {
                bytes.extend_from_slice(b);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `ids` starting with `bos` (added unless the text already began with it).
fn with_bos(mut ids: Vec<u32>, bos: u32) -> Vec<u32> {
    if ids.first() != Some(&bos) {
        ids.insert(0, bos);
    }
    ids
}

fn encode_failed(error: tokenizers::Error) -> ApiError {
    tracing::warn!(%error, "tokenizer failed to encode");
    ApiError::Internal
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .finish_non_exhaustive()
    }
}
