//! GPT-2's byte-level alphabet: every byte maps to one printable char so BPE vocabularies can be
//! stored as text. Reference: `bytes_to_unicode` in OpenAI's GPT-2 `encoder.py`.

use std::collections::HashMap;
use std::sync::OnceLock;

/// `byte -> char` as GPT-2 defines it: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100.. in order.
pub fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + next_extra).expect("U+0100.. are chars");
            next_extra += 1;
            c
        };
    }
    table
}

/// The byte a char of the alphabet stands for, or `None` for a char outside it.
pub fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        byte_to_char()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect()
    });
    table.get(&c).copied()
}

/// The raw bytes a byte-level vocabulary entry stands for, or `None` if it holds a char outside
/// the byte-level alphabet (then it is not a byte-level token).
pub fn token_to_bytes(token: &str) -> Option<Vec<u8>> {
    token.chars().map(char_to_byte).collect()
}

/// Like [`token_to_bytes`], but a char outside the alphabet stands for its own UTF-8 bytes.
pub fn token_to_bytes_lenient(token: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_over_bytes() {
        let table = byte_to_char();
        let distinct: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(token_to_bytes("Ġhello"), Some(b" hello".to_vec()));
        assert_eq!(token_to_bytes("日"), None);
    }

    #[test]
    fn lenient_decoding_keeps_foreign_chars_as_utf8() {
        assert_eq!(token_to_bytes_lenient("Ġ日"), " 日".as_bytes().to_vec());
        assert_eq!(token_to_bytes_lenient("Ã©"), "é".as_bytes().to_vec());
    }
}
