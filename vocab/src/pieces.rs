//! SentencePiece spellings: `<0xAB>` byte-fallback tokens and `▁` for a space.

/// The byte a `<0xAB>` byte-fallback token stands for, or `None` for any other piece.
pub fn byte_token(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// The raw bytes of a SentencePiece piece: its byte if it is a byte token, else its text with
/// `▁` as a space.
pub fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    match byte_token(piece) {
        Some(b) => vec![b],
        None => piece.replace('\u{2581}', " ").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_parse_only_in_their_exact_form() {
        assert_eq!(byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_token("<0xff>"), Some(0xFF));
        assert_eq!(byte_token("<0x100>"), None);
        assert_eq!(byte_token("<0xZZ>"), None);
        assert_eq!(byte_token("0x0A"), None);
    }

    #[test]
    fn pieces_spell_spaces_with_a_lower_bar() {
        assert_eq!(sentencepiece_bytes("\u{2581}the"), b" the".to_vec());
        assert_eq!(sentencepiece_bytes("<0x41>"), b"A".to_vec());
    }
}
