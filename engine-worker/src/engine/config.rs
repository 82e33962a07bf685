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

// Defaults of the worker's options, stated once: `#[arg(default_value_t)]` and
// `EngineConfig::default()` both read them.
/// Default K (`--num-spec-tokens`).
pub const DEFAULT_NUM_SPEC_TOKENS: usize = 4;
/// Default `--ngram-min`.
pub const DEFAULT_NGRAM_MIN: usize = 1;
/// Default `--ngram-max`.
pub const DEFAULT_NGRAM_MAX: usize = 4;
/// Default `--max-num-seqs`.
pub const DEFAULT_MAX_NUM_SEQS: usize = 16;
/// Default `--max-model-len`.
pub const DEFAULT_MAX_MODEL_LEN: usize = 2048;
/// Default `--max-num-batched-tokens`.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;
/// Default `--max-waiting`.
pub const DEFAULT_MAX_WAITING: usize = 1024;
/// Default `--prefix-caching`.
pub const DEFAULT_PREFIX_CACHING: bool = true;

/// The engine's limits and drafting, also the worker's options of the same names (the doc
/// comments of the fields are their `--help`).
#[derive(Debug, Clone, clap::Args)]
pub struct EngineConfig {
    /// K: draft tokens per verification step; 0 turns speculative decoding off.
    #[arg(long, env = "SPECULA_NUM_SPEC_TOKENS", default_value_t = DEFAULT_NUM_SPEC_TOKENS)]
    pub num_spec_tokens: usize,
    /// Drafting policy: `goodput` drafts only what is expected to pay in the current batch;
    /// `fixed` verifies every proposed token up to K.
    #[arg(
        long,
        env = "SPECULA_SPEC_POLICY",
        value_enum,
        default_value = SpecPolicy::default().name()
    )]
    pub spec_policy: SpecPolicy,
    /// Draft proposer: `suffix` (suffix trees over the request and recent outputs, so answers
    /// repeated across requests are drafted too) or `ngram` (prompt lookup).
    #[arg(long, env = "SPECULA_PROPOSER", value_enum, default_value = ProposerKind::default().name())]
    pub proposer: ProposerKind,
    /// Shortest suffix the n-gram proposer matches.
    #[arg(long, env = "SPECULA_NGRAM_MIN", default_value_t = DEFAULT_NGRAM_MIN)]
    pub ngram_min: usize,
    /// Longest suffix the n-gram proposer matches (tried first).
    #[arg(long, env = "SPECULA_NGRAM_MAX", default_value_t = DEFAULT_NGRAM_MAX)]
    pub ngram_max: usize,
    #[command(flatten)]
    pub suffix: SuffixConfig,
    /// Most sequences running at once.
    #[arg(long, env = "SPECULA_MAX_NUM_SEQS", default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    /// Most positions (prompt + output) per sequence; clamped to the model and the cache.
    #[arg(long, env = "SPECULA_MAX_MODEL_LEN", default_value_t = DEFAULT_MAX_MODEL_LEN)]
    pub max_model_len: usize,
    /// Token budget of one step (prompt tokens plus K+1 per running sequence).
    #[arg(long, env = "SPECULA_MAX_NUM_BATCHED_TOKENS",
          default_value_t = DEFAULT_MAX_NUM_BATCHED_TOKENS)]
    pub max_num_batched_tokens: usize,
    /// Waiting-queue bound; beyond it requests are refused as overloaded.
    #[arg(long, env = "SPECULA_MAX_WAITING", default_value_t = DEFAULT_MAX_WAITING)]
    pub max_waiting: usize,
    /// Automatic prefix caching: prompts that start with the same full KV blocks as an earlier
    /// prompt share that prompt's cache instead of computing it again (`false` turns it off).
    #[arg(long, env = "SPECULA_PREFIX_CACHING", default_value_t = DEFAULT_PREFIX_CACHING,
          action = clap::ArgAction::Set)]
    pub prefix_caching: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_spec_tokens: DEFAULT_NUM_SPEC_TOKENS,
            spec_policy: SpecPolicy::default(),
            proposer: ProposerKind::default(),
            ngram_min: DEFAULT_NGRAM_MIN,
            ngram_max: DEFAULT_NGRAM_MAX,
            suffix: SuffixConfig::default(),
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_model_len: DEFAULT_MAX_MODEL_LEN,
            max_waiting: DEFAULT_MAX_WAITING,
            prefix_caching: DEFAULT_PREFIX_CACHING,
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
