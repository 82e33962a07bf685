//! The bytes each token id of a GGUF vocabulary (`tokenizer.ggml.tokens`) decodes to, as the
//! engine-worker matches stop strings on them.

use crate::{bytelevel, pieces};

/// How the vocabulary spells bytes (`tokenizer.ggml.model`).
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
}

/// GGUF token type of control tokens (`<|im_end|>` and the like), which decode to nothing.
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens, matched whole like control tokens but shown.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The bytes each token id decodes to.
#[derive(Debug, Clone)]
pub struct TokenBytes {
    bytes: Vec<Vec<u8>>,
}

impl TokenBytes {
    /// `token_types` is `tokenizer.ggml.token_type` when present.
    pub fn new(tokens: &[String], token_types: Option<&[i32]>, kind: VocabKind) -> Self {
        let bytes = tokens
            .iter()
            .enumerate()
            .map(|(id, text)| {
                if token_types.and_then(|t| t.get(id)) == Some(&TOKEN_TYPE_CONTROL) {
                    return Vec::new();
                }
                match kind {
                    VocabKind::ByteLevel => bytelevel::token_to_bytes_lenient(text),
                    VocabKind::SentencePiece => pieces::sentencepiece_bytes(text),
                }
            })
            .collect();
        Self { bytes }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The token's bytes; unknown ids decode to nothing.
    pub fn get(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
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
