//! Speculative decoding: a [`Proposer`] drafts up to K tokens per sequence and step; the
//! [`verifier`] checks them against the target model's K+1 logits rows from one forward and
//! accepts the longest valid prefix plus one token of the target's own.

mod ngram;
mod proposer;
pub mod verifier;

pub use ngram::NgramProposer;
pub use proposer::Proposer;
pub use verifier::{verify, Verdict};
