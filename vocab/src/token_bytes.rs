//! The bytes each token id of a vocabulary decodes to: one rule for the engine-worker (which
//! matches stop strings on them) and the api-server (which decodes output and renders control
//! tokens in chat templates), so both read the same text out of the same ids.

use crate::{bytelevel, pieces};

/// How the vocabulary spells bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE ("gpt2"): every byte is drawn as one printable character.
    ByteLevel,
    /// SentencePiece ("llama"): `▁` for a space, `<0xAB>` tokens for raw bytes.
    SentencePiece,
}

impl VocabKind {
    /// From GGUF `tokenizer.ggml.model`; anything but "llama" is taken as byte-level.
    pub fn from_gguf_model(model: Option<&str>) -> Self {
        match model {
            Some("llama") => Self::SentencePiece,
            _ => Self::ByteLevel,
        }
    }

    /// From the `decoder` of an HF `tokenizer.json`, as JSON text: byte-level when it is (or
    /// contains) a `ByteLevel` decoder, SentencePiece-style otherwise.
    pub fn from_hf_decoder(decoder_json: Option<&str>) -> Self {
        match decoder_json {
            Some(json) if json.contains("\"ByteLevel\"") => Self::ByteLevel,
            _ => Self::SentencePiece,
        }
    }

    /// The bytes an ordinary vocabulary entry stands for.
    pub fn piece_bytes(self, piece: &str) -> Vec<u8> {
        match self {
            Self::ByteLevel => bytelevel::token_to_bytes_lenient(piece),
            Self::SentencePiece => pieces::sentencepiece_bytes(piece),
        }
    }
}

/// GGUF token type of control tokens (`<|im_end|>` and the like), which decode to nothing.
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens, matched whole like control tokens but shown.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// One vocabulary entry as the tokenizer file gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// An ordinary token, spelled the vocabulary's way.
    Piece(&'a str),
    /// A control token: its text is literal, and it decodes to nothing in output.
    Control(&'a str),
    /// A user-defined (added, not special) token: its literal text, shown in output.
    UserDefined(&'a str),
    /// An id the file leaves without a token.
    Missing,
}

/// The bytes each token id decodes to.
#[derive(Debug, Clone)]
pub struct TokenBytes {
    /// Per id: the output bytes, or a control token's literal text.
    bytes: Vec<Vec<u8>>,
    control: Vec<bool>,
}

impl TokenBytes {
    /// A GGUF vocabulary: `tokens` is `tokenizer.ggml.tokens`, `token_types` is
    /// `tokenizer.ggml.token_type` when present.
    pub fn new(tokens: &[String], token_types: Option<&[i32]>, kind: VocabKind) -> Self {
        let entries = tokens.iter().enumerate().map(|(id, text)| {
            match token_types.and_then(|t| t.get(id)).copied() {
                Some(TOKEN_TYPE_CONTROL) => Entry::Control(text),
                Some(TOKEN_TYPE_USER_DEFINED) => Entry::UserDefined(text),
                _ => Entry::Piece(text),
            }
        });
        Self::from_entries(entries, kind)
    }

    /// Any vocabulary, one entry per id in order.
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = Entry<'a>>, kind: VocabKind) -> Self {
        let (bytes, control) = entries
            .into_iter()
            .map(|entry| match entry {
                Entry::Piece(piece) => (kind.piece_bytes(piece), false),
                Entry::Control(text) => (text.as_bytes().to_vec(), true),
                Entry::UserDefined(text) => (text.as_bytes().to_vec(), false),
                Entry::Missing => (Vec::new(), false),
            })
            .unzip();
        Self { bytes, control }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The token's bytes in output; control tokens and unknown ids decode to nothing.
    pub fn get(&self, id: u32) -> &[u8] {
        if self.is_control(id) {
            return &[];
        }
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The token's text as the vocabulary writes it (a control token's literal text), or `None`
    /// for an id outside the vocabulary.
    pub fn literal(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).map(Vec::as_slice)
    }

    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .flat_map(|&id| self.get(id).iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_tokens_decode_to_their_bytes() {
        let tokens: Vec<String> = [
            "Hello",
            "\u{120}world",
            "\u{10a}",
            "<|im_end|>",
            "\u{c3}\u{a9}",
        ]
        .map(String::from)
        .to_vec();
        let v = TokenBytes::new(&tokens, Some(&[1, 1, 1, 3, 1]), VocabKind::ByteLevel);
        assert_eq!(v.decode(&[0, 1, 2, 3]), b"Hello world\n".to_vec());
        assert_eq!(v.get(4), "é".as_bytes());
        assert_eq!(v.get(99), b"");
    }

    #[test]
    fn sentencepiece_tokens_decode_spaces_and_bytes() {
        let tokens: Vec<String> = ["\u{2581}the", "<0x0A>"].map(String::from).to_vec();
        let v = TokenBytes::new(&tokens, None, VocabKind::SentencePiece);
        assert_eq!(v.decode(&[0, 1]), b" the\n".to_vec());
    }

    #[test]
    fn control_tokens_keep_their_text_but_decode_to_nothing() {
        let tokens: Vec<String> = ["<|im_end|>", "<think>", "\u{120}hi"]
            .map(String::from)
            .to_vec();
        let v = TokenBytes::new(&tokens, Some(&[3, 4, 1]), VocabKind::ByteLevel);
        assert!(v.is_control(0) && !v.is_control(1) && !v.is_control(2));
        assert_eq!(v.literal(0), Some(&b"<|im_end|>"[..]));
        assert_eq!(v.get(0), b"");
        assert_eq!(v.decode(&[0, 1, 2]), b"<think> hi".to_vec());
        assert_eq!(v.literal(3), None);
    }

    #[test]
    fn hf_entries_follow_the_same_rule_as_gguf_ones() {
        let gguf_tokens: Vec<String> = ["<s>", "<u>", "\u{2581}the", "<0x0A>"]
            .map(String::from)
            .to_vec();
        let gguf = TokenBytes::new(&gguf_tokens, Some(&[3, 4, 1, 6]), VocabKind::SentencePiece);
        let entries = [
            Entry::Control("<s>"),
            Entry::UserDefined("<u>"),
            Entry::Piece("\u{2581}the"),
            Entry::Piece("<0x0A>"),
            Entry::Missing,
        ];
        let hf = TokenBytes::from_entries(entries, VocabKind::SentencePiece);
        for id in 0..4 {
            assert_eq!(hf.get(id), gguf.get(id), "id {id}");
            assert_eq!(hf.literal(id), gguf.literal(id), "id {id}");
        }
        assert_eq!(hf.decode(&[0, 1, 2, 3, 4]), b"<u> the\n".to_vec());
    }

    #[test]
    fn hf_decoders_name_their_kind() {
        let byte_level = r#"{"type":"ByteLevel","add_prefix_space":false}"#;
        let sequence = r#"{"type":"Sequence","decoders":[{"type":"ByteFallback"}]}"#;
        assert_eq!(
            VocabKind::from_hf_decoder(Some(byte_level)),
            VocabKind::ByteLevel
        );
        assert_eq!(
            VocabKind::from_hf_decoder(Some(sequence)),
            VocabKind::SentencePiece
        );
        assert_eq!(VocabKind::from_hf_decoder(None), VocabKind::SentencePiece);
    }

    #[test]
    fn only_llama_vocabularies_are_sentencepiece() {
        assert_eq!(
            VocabKind::from_gguf_model(Some("llama")),
            VocabKind::SentencePiece
        );
        assert_eq!(
            VocabKind::from_gguf_model(Some("gpt2")),
            VocabKind::ByteLevel
        );
        assert_eq!(VocabKind::from_gguf_model(None), VocabKind::ByteLevel);
    }
}
