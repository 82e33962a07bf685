//! Prompt-lookup decoding (Saxena 2023, "Prompt Lookup Decoding"; vLLM's n-gram proposer): find
//! the sequence's last n tokens earlier in the sequence and propose what followed them there.

use super::{Proposer, SeqKey};

#[derive(Debug, Clone)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
}

impl NgramProposer {
    /// Matches suffixes of `min_n..=max_n` tokens, longest first. Needs `1 <= min_n <= max_n`.
    pub fn new(min_n: usize, max_n: usize) -> Self {
        assert!(
            1 <= min_n && min_n <= max_n,
            "need 1 <= ngram_min <= ngram_max"
        );
        Self { min_n, max_n }
    }
}

impl Proposer for NgramProposer {
    fn name(&self) -> &str {
        "ngram"
    }

    fn propose(
        &mut self,
        _seq: SeqKey,
        tokens: &[u32],
        max_drafts: usize,
        out: &mut Vec<u32>,
    ) -> usize {
        if max_drafts == 0 {
            return 0;
        }
        let len = tokens.len();
        for n in (self.min_n..=self.max_n).rev() {
            if n >= len {
                continue;
            }
            let suffix = &tokens[len - n..];
            // The most recent earlier occurrence: nearby text predicts best.
            let hit = (0..len - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = hit {
                let from = start + n;
                let to = (from + max_drafts).min(len);
                out.extend_from_slice(&tokens[from..to]);
                return n;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(p: &NgramProposer, tokens: &[u32], k: usize) -> Vec<u32> {
        let mut out = Vec::new();
        p.clone().propose(0, tokens, k, &mut out);
        out
    }

    #[test]
    fn the_strength_is_the_matched_length() {
        let mut p = NgramProposer::new(1, 3);
        let mut out = Vec::new();
        assert_eq!(p.propose(0, &[1, 2, 3, 4, 1, 2, 9, 1, 2], 4, &mut out), 2);
        out.clear();
        assert_eq!(p.propose(0, &[7, 1, 2, 3, 7, 1, 2, 3], 4, &mut out), 3);
        out.clear();
        assert_eq!(p.propose(0, &[5, 6, 7], 4, &mut out), 0);
        assert!(out.is_empty());
    }

    #[test]
    fn proposes_what_followed_the_latest_match() {
        let p = NgramProposer::new(1, 3);
        // suffix [1, 2] occurs at 0 and 4; the later one is followed by 9, 1.
        assert_eq!(propose(&p, &[1, 2, 3, 4, 1, 2, 9, 1, 2], 4), vec![9, 1, 2]);
        assert_eq!(propose(&p, &[1, 2, 3, 4, 1, 2, 9, 1, 2], 1), vec![9]);
        assert_eq!(propose(&p, &[5, 6, 7], 4), Vec::<u32>::new());
        assert_eq!(propose(&p, &[5, 6, 5], 0), Vec::<u32>::new());
    }

    #[test]
    fn prefers_longer_ngrams() {
        let p = NgramProposer::new(1, 2);
        // 1-gram [2] last occurs at 5 (followed by 8); the 2-gram [1, 2] at 0 (followed by 3).
        assert_eq!(propose(&p, &[1, 2, 3, 7, 7, 2, 8, 1, 2], 2), vec![3, 7]);
        let p = NgramProposer::new(1, 1);
        assert_eq!(propose(&p, &[1, 2, 3, 7, 7, 2, 8, 1, 2], 2), vec![8, 1]);
    }

    #[test]
    fn respects_min_n() {
        let p = NgramProposer::new(2, 3);
        assert_eq!(propose(&p, &[4, 1, 5, 1], 3), Vec::<u32>::new());
    }
}
