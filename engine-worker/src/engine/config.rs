//! Engine limits and the admission check every request passes before it is queued.

use proto::api_worker::{AddRequest, LogitsProcessors, RejectReason};

use crate::spec::{SpecPolicy, SuffixConfig};

/// Which proposer drafts (the worker's `--proposer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProposerKind {
    /// Prompt lookup: what followed the latest earlier occurrence of the last n tokens.
    Ngram,
    /// SuffixDecoding: the most frequent continuation of the longest matching suffix, in a
    /// suffix trie of the request's tokens and one of recent requests' outputs.
    // The default: in the serving runs of `docs/history/benchmarks-notebook.md` it matches
    // n-gram with 8 clients and beats it with one.
    #[default]
    Suffix,
}

impl ProposerKind {
    /// The name the proposer reports in hellos, traces and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            ProposerKind::Ngram => "ngram",
            ProposerKind::Suffix => "suffix",
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// K: most draft tokens per verify step; 0 turns speculation off.
    pub num_spec_tokens: usize,
    /// How many of the proposed drafts (up to K) each sequence verifies per step.
    pub spec_policy: SpecPolicy,
    pub proposer: ProposerKind,
    pub ngram_min: usize,
    pub ngram_max: usize,
    pub suffix: SuffixConfig,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    /// Bound on the waiting queue; beyond it requests are refused as overloaded.
    pub max_waiting: usize,
    /// Automatic prefix caching: a request whose prompt starts with full blocks that an earlier
    /// prompt computed shares their cache instead of recomputing them.
    pub prefix_caching: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_spec_tokens: 4,
            spec_policy: SpecPolicy::default(),
            proposer: ProposerKind::default(),
            ngram_min: 1,
            ngram_max: 4,
            suffix: SuffixConfig::default(),
            max_num_seqs: 16,
            max_num_batched_tokens: 2048,
            max_model_len: 2048,
            max_waiting: 1024,
            prefix_caching: true,
        }
    }
}

/// Rejects a request that can never run: empty prompt, unknown token ids, bad parameters, or
/// prompt plus `max_tokens` past the model length. The worker's one check of a request (run by
/// `Engine::add_request`): the api-server validates at its edge, but any client may speak the
/// protocol, and the engine stays sound only with these.
pub fn validate_request(
    req: &AddRequest,
    max_model_len: usize,
    vocab_size: usize,
    has_token_bytes: bool,
) -> Result<(), RejectReason> {
    let invalid = |msg: String| Err(RejectReason::Invalid(msg));
    let prompt = req.prompt_token_ids.len();
    if prompt == 0 {
        return invalid("prompt is empty".into());
    }
    if let Some(&bad) = req
        .prompt_token_ids
        .iter()
        .find(|&&t| t as usize >= vocab_size)
    {
        return invalid(format!(
            "prompt token id {bad} is outside the vocabulary ({vocab_size})"
        ));
    }
    if req.max_tokens == 0 {
        return invalid("max_tokens must be at least 1".into());
    }
    if prompt + req.max_tokens as usize > max_model_len {
        return invalid(format!(
            "prompt ({prompt} tokens) plus max_tokens ({}) exceeds the model length {max_model_len}",
            req.max_tokens
        ));
    }
    let s = &req.sampling;
    if !s.temperature.is_finite() || s.temperature < 0.0 {
        return invalid(format!(
            "temperature {} is not a finite value >= 0",
            s.temperature
        ));
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        return invalid(format!("top_p {} is not in (0, 1]", s.top_p));
    }
    if s.logprobs.is_some_and(|n| n > proto::MAX_TOP_LOGPROBS) {
        return invalid(format!(
            "logprobs asks for more than {} alternatives",
            proto::MAX_TOP_LOGPROBS
        ));
    }
    if s.prompt_logprobs
        .is_some_and(|n| n > proto::MAX_TOP_LOGPROBS)
    {
        return invalid(format!(
            "prompt_logprobs asks for more than {} alternatives",
            proto::MAX_TOP_LOGPROBS
        ));
    }
    if !req.stop.stop_strings.is_empty() && !has_token_bytes {
        return invalid("stop strings need the model's vocabulary, which this model lacks".into());
    }
    validate_processors(&s.processors, vocab_size).map_err(RejectReason::Invalid)
}

/// Most `logit_bias` entries a request may carry (OpenAI's limit is 300 by its docs' examples;
/// this bounds the work per row).
pub const MAX_LOGIT_BIAS: usize = 1024;

fn validate_processors(p: &LogitsProcessors, vocab_size: usize) -> Result<(), String> {
    let finite = [
        p.presence_penalty,
        p.frequency_penalty,
        p.repetition_penalty,
        p.min_p,
    ];
    if finite.iter().any(|v| !v.is_finite()) {
        return Err("a logits processor's value is not finite".into());
    }
    if p.repetition_penalty <= 0.0 {
        return Err(format!(
            "repetition_penalty {} is not > 0",
            p.repetition_penalty
        ));
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return Err(format!("min_p {} is not in [0, 1]", p.min_p));
    }
    if p.logit_bias.len() > MAX_LOGIT_BIAS {
        return Err(format!("more than {MAX_LOGIT_BIAS} logit_bias entries"));
    }
    if let Some(&(id, bias)) = p
        .logit_bias
        .iter()
        .find(|(id, bias)| *id as usize >= vocab_size || !bias.is_finite())
    {
        return Err(format!(
            "logit_bias entry ({id}, {bias}) is outside the vocabulary ({vocab_size}) or not finite"
        ));
    }
    use proto::api_worker::{MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS};
    if p.bad_words.len() > MAX_BAD_WORDS
        || p.bad_words.iter().any(|w| {
            w.is_empty()
                || w.len() > MAX_BAD_WORD_TOKENS
                || w.iter().any(|&t| t as usize >= vocab_size)
        })
    {
        return Err(format!(
            "bad_words: at most {MAX_BAD_WORDS} sequences of 1 to {MAX_BAD_WORD_TOKENS} tokens \
             inside the vocabulary"
        ));
    }
    Ok(())
}
