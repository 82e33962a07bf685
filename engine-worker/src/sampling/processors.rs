//! Logits processors with vLLM's meanings and order (vllm/v1/sample/sampler.py): min_tokens
//! and logit bias, then the repetition penalty (CTRL, Keskar et al. 2019) over the prompt and
//! the output, then the frequency and presence penalties over the output (OpenAI's
//! definitions). min_p acts later, on the distribution
//! ([`Distribution`](super::Distribution)).
//!
//! A row is processed as the sequential decode would see it at its output position: the
//! verifier keeps a [`Processing`] per sequence and step and [`push`](Processing::push)es each
//! draft it accepts, so the row after it sees the counts that decode would have had. That keeps
//! speculation lossless with every processor.

use std::collections::{HashMap, HashSet};

use proto::api_worker::LogitsProcessors;

/// What a sequence has produced so far, as its processors need it.
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    /// The prompt followed by the output so far.
    pub tokens: &'a [u32],
    pub prompt_len: usize,
    /// Tokens that end the request (EOS unless ignored, and the stop tokens): masked before
    /// `min_tokens` outputs.
    pub stop_ids: &'a [u32],
}

impl History<'_> {
    /// No history: a row as the first of an empty output, with nothing that stops.
    pub const EMPTY: History<'static> = History {
        tokens: &[],
        prompt_len: 0,
        stop_ids: &[],
    };
}

/// The processors' state at one output position of one sequence.
#[derive(Debug)]
pub struct Processing<'a> {
    params: &'a LogitsProcessors,
    stop_ids: &'a [u32],
    /// Occurrences of each token in the output so far.
    output_counts: HashMap<u32, u32>,
    /// Tokens of the prompt (only kept when the repetition penalty is on).
    prompt_tokens: HashSet<u32>,
    /// Output tokens before the position being processed.
    generated: usize,
    /// The output's last tokens, as many as the longest bad word needs to be recognized (its
    /// length less one); empty without bad words.
    tail: Vec<u32>,
}

impl<'a> Processing<'a> {
    /// The state before output position `history.tokens.len() - history.prompt_len`, or
    /// `None` when the processors leave logits unchanged (the common case costs nothing).
    pub fn new(params: &'a LogitsProcessors, history: &History<'a>) -> Option<Self> {
        if !params.changes_logits() {
            return None;
        }
        let prompt_len = history.prompt_len.min(history.tokens.len());
        let (prompt, output) = history.tokens.split_at(prompt_len);
        let mut output_counts = HashMap::new();
        for &t in output {
            *output_counts.entry(t).or_insert(0) += 1;
        }
        let prompt_tokens = match params.repetition_penalty != 1.0 {
            true => prompt.iter().copied().collect(),
            false => HashSet::new(),
        };
        let keep = bad_word_context(params);
        Some(Self {
            params,
            stop_ids: history.stop_ids,
            output_counts,
            prompt_tokens,
            generated: output.len(),
            tail: output[output.len().saturating_sub(keep)..].to_vec(),
        })
    }

    /// `token` was emitted at the current position: the state moves to the next one.
    pub fn push(&mut self, token: u32) {
        *self.output_counts.entry(token).or_insert(0) += 1;
        self.generated += 1;
        let keep = bad_word_context(self.params);
        if keep > 0 {
            self.tail.push(token);
            if self.tail.len() > keep {
                self.tail.remove(0);
            }
        }
    }

    /// Applies the processors to one row of logits (`[vocab]`) at the current position.
    pub fn apply(&self, row: &mut [f32]) {
        let p = self.params;
        let mut set = |id: u32, f: &dyn Fn(f32) -> f32| {
            if let Some(v) = row.get_mut(id as usize) {
                *v = f(*v);
            }
        };
        if self.generated < p.min_tokens as usize {
            for &id in self.stop_ids {
                set(id, &|_| f32::NEG_INFINITY);
            }
        }
        for &(id, bias) in &p.logit_bias {
            set(id, &|v| v + bias);
        }
        if p.repetition_penalty != 1.0 {
            let r = p.repetition_penalty;
            let penalize = |v: f32| if v > 0.0 { v / r } else { v * r };
            let seen: HashSet<u32> = self
                .prompt_tokens
                .iter()
                .chain(self.output_counts.keys())
                .copied()
                .collect();
            for id in seen {
                set(id, &penalize);
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&id, &count) in &self.output_counts {
                let by = p.frequency_penalty * count as f32 + p.presence_penalty;
                set(id, &|v| v - by);
            }
        }
        for word in &p.bad_words {
            if let Some((&last, before)) = word.split_last() {
                if self.tail.ends_with(before) {
                    set(last, &|_| f32::NEG_INFINITY);
                }
            }
        }
    }
}

/// Output tokens a bad word's recognition needs: the longest one's length less one.
fn bad_word_context(params: &LogitsProcessors) -> usize {
    params
        .bad_words
        .iter()
        .map(|w| w.len().saturating_sub(1))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> LogitsProcessors {
        LogitsProcessors::NONE
    }

    #[test]
    fn neutral_processors_cost_nothing() {
        let history = History {
            tokens: &[1, 2, 3],
            prompt_len: 1,
            stop_ids: &[0],
        };
        assert!(Processing::new(&LogitsProcessors::NONE, &history).is_none());
    }

    #[test]
    fn penalties_follow_the_output_counts_and_repetition_the_prompt_too() {
        let mut p = params();
        p.frequency_penalty = 0.5;
        p.presence_penalty = 1.0;
        p.repetition_penalty = 2.0;
        // Prompt [4]; output [1, 1, 2].
        let history = History {
            tokens: &[4, 1, 1, 2],
            prompt_len: 1,
            stop_ids: &[],
        };
        let state = Processing::new(&p, &history).unwrap();
        let mut row = vec![3.0, 3.0, -3.0, 3.0, 3.0];
        state.apply(&mut row);
        // 0: untouched. 1: 3/2 − (0.5·2 + 1) = −0.5. 2: −3·2 − (0.5 + 1) = −7.5.
        // 3: untouched. 4 (prompt only): 3/2.
        assert_eq!(row, vec![3.0, -0.5, -7.5, 3.0, 1.5]);
    }

    #[test]
    fn pushing_an_accepted_draft_moves_to_the_next_position() {
        let mut p = params();
        p.presence_penalty = 1.0;
        p.min_tokens = 2;
        let history = History {
            tokens: &[7, 3],
            prompt_len: 1,
            stop_ids: &[0],
        };
        // One output token so far: EOS (0) masked at position 1, allowed from position 2.
        let mut state = Processing::new(&p, &history).unwrap();
        let mut row = vec![1.0; 4];
        state.apply(&mut row);
        assert_eq!(row, vec![f32::NEG_INFINITY, 1.0, 1.0, 0.0]);
        state.push(1);
        let mut row = vec![1.0; 4];
        state.apply(&mut row);
        assert_eq!(row, vec![1.0, 0.0, 1.0, 0.0]);
    }

    /// A bad word's last token is ruled out only where the output ends with the rest of it,
    /// at every position a verify step scores (the tail follows the pushed drafts).
    #[test]
    fn bad_words_rule_out_their_last_token_after_the_rest() {
        let mut p = params();
        p.bad_words = vec![vec![2], vec![1, 3], vec![1, 1, 0]];
        // Output so far: [1].
        let history = History {
            tokens: &[9, 1],
            prompt_len: 1,
            stop_ids: &[],
        };
        let mut state = Processing::new(&p, &history).unwrap();
        let mut row = vec![0.0; 4];
        state.apply(&mut row);
        // 2 always; 3 after 1; 0 not yet (needs [1, 1]).
        assert_eq!(row, vec![0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        state.push(1);
        let mut row = vec![0.0; 4];
        state.apply(&mut row);
        assert_eq!(
            row,
            vec![f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]
        );
        state.push(0);
        let mut row = vec![0.0; 4];
        state.apply(&mut row);
        assert_eq!(row, vec![0.0, 0.0, f32::NEG_INFINITY, 0.0]);
    }

    #[test]
    fn logit_bias_adds_and_ignores_ids_outside_the_row() {
        let mut p = params();
        p.logit_bias = vec![(1, 5.0), (2, -100.0), (99, 1.0)];
        let state = Processing::new(&p, &History::EMPTY).unwrap();
        let mut row = vec![0.0; 3];
        state.apply(&mut row);
        assert_eq!(row, vec![0.0, 5.0, -100.0]);
    }
}
