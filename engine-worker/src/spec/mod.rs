//! Speculative decoding: a [`Proposer`] (n-gram prompt lookup or suffix trees) or a
//! [`Drafter`] (a draft model or the target's first layers, [`ModelDrafter`]; an EAGLE-3 head
//! over the target's hidden states, [`HeadDrafter`]) drafts up to K tokens per
//! sequence and step; the [`DraftPlanner`] decides how many of them each sequence verifies (by
//! expected gain, or all of them; a model drafter drafts only those); the [`verifier`] checks
//! them against the target model's logits rows from one forward and accepts the longest valid
//! prefix plus one token of the target's own.

pub mod acceptance;
pub mod cost;
mod draft_kv;
mod draft_model;
mod drafter;
mod head;
mod ngram;
mod planner;
pub mod policy;
mod proposer;
mod suffix;
mod suffix_cache;
mod suffix_tree;
pub mod verifier;

pub use acceptance::RequestAcceptance;
pub use cost::StepCost;
pub use draft_kv::DraftKv;
pub use draft_model::{DraftJob, ModelDrafter, ModelSource};
pub use drafter::{DraftSource, Drafter, TargetRows};
pub use head::HeadDrafter;
pub use ngram::NgramProposer;
pub use planner::DraftPlanner;
pub use policy::{DraftCandidate, SpecPolicy};
pub use proposer::{Proposer, SeqKey};
pub use suffix::{SuffixConfig, SuffixProposer};
pub use verifier::{verify, verify_masked, Verification};
