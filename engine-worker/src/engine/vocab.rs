//! Token bytes for stop strings, from a GGUF vocabulary (`tokenizer.ggml.tokens`).

/// How the vocabulary spells bytes (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE ("gpt2"): every byte is drawn as one printable character.
    ByteLevel,
    /// SentencePiece ("llama"): `▁` for a space, `<0xAB>` tokens for raw bytes.
    SentencePiece,
}

/// GGUF token type of control tokens (`<|im_end|>` and the like), which decode to nothing.
const TOKEN_TYPE_CONTROL: i32 = 3;

/// The bytes each token id decodes to.
#[derive(Debug, Clone)]
pub struct TokenBytes {
    bytes: Vec<Vec<u8>>,
}

/// GPT-2's byte-to-unicode table reversed: the byte a printable stand-in character means.
fn byte_level_decoder() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let ch = if printable(b) {
            char::from(b)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).expect("valid code point")
        };
        map.insert(ch, b);
    }
    map
}

impl TokenBytes {
    /// `token_types` is `tokenizer.ggml.token_type` when present.
    pub fn new(tokens: &[String], token_types: Option<&[i32]>, kind: VocabKind) -> Self {
        let decoder = byte_level_decoder();
        let bytes = tokens
            .iter()
            .enumerate()
            .map(|(id, text)| {
                if token_types.and_then(|t| t.get(id)) == Some(&TOKEN_TYPE_CONTROL) {
                    return Vec::new();
                }
                match kind {
                    VocabKind::ByteLevel => text
                        .chars()
                        .flat_map(|c| match decoder.get(&c) {
                            Some(&b) => vec![b],
                            None => c.to_string().into_bytes(),
                        })
                        .collect(),
                    VocabKind::SentencePiece => sentencepiece_bytes(text),
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

impl TokenBytes {
    /// From the vocabulary fields a loaded model carries.
    pub fn from_tokenizer(t: &crate::model::TokenizerData) -> Self {
        let kind = match t.model.as_deref() {
            Some("llama") => VocabKind::SentencePiece,
            _ => VocabKind::ByteLevel,
        };
        Self::new(&t.tokens, t.token_types.as_deref(), kind)
    }
}

fn sentencepiece_bytes(text: &str) -> Vec<u8> {
    if let Some(hex) = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    text.replace('\u{2581}', " ").into_bytes()
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
}
