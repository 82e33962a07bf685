//! Structured output (OpenAI's `response_format` `json_object` and `json_schema`): a JSON
//! schema compiled by llguidance (Moskal et al., <https://github.com/guidance-ai/llguidance>,
//! the grammar engine vLLM, SGLang and llama.cpp use) over the model's vocabulary into a
//! [`Grammar`] that answers, at each output position, which tokens may come next.
//!
//! Speculation asks more of it than decoding does: a verify step scores the rows after each
//! draft, so [`Grammar::draft_masks`] walks the drafts (the grammar's state after each) and
//! rolls back, and [`Grammar::accept`] then moves past the tokens the verifier emitted.
//! [`Grammar::forced`] drafts the text the grammar leaves no choice about, which the target
//! accepts whenever it spells it the same way.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};
use vocab::TokenBytes;

pub mod samples;

/// Most bytes of a schema a request may carry (its text as sent).
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrammarError {
    #[error("the schema is {len} bytes; at most {max} are accepted")]
    TooLarge { len: usize, max: usize },
    #[error("the schema is not JSON: {reason}")]
    NotJson { reason: String },
    #[error("the schema cannot be compiled: {reason}")]
    Compile { reason: String },
    #[error("the vocabulary cannot be indexed for grammars: {reason}")]
    Vocabulary { reason: String },
    #[error("the grammar failed: {reason}")]
    Failed { reason: String },
    #[error(
        "the schema needs more work per token than the server allows ({limit} {value}): {reason}"
    )]
    OverLimit {
        limit: &'static str,
        value: u64,
        reason: String,
    },
}

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// Any JSON object.
    JsonObject,
    /// JSON matching this schema (its text).
    JsonSchema(String),
}

impl Constraint {
    /// The schema llguidance compiles: the request's, with compact separators and no free
    /// whitespace (OpenAI's output shape; free whitespace lets a small model pad forever).
    fn schema(&self) -> Result<Value, GrammarError> {
        let mut schema = match self {
            Constraint::JsonObject => serde_json::json!({"type": "object"}),
            Constraint::JsonSchema(text) => {
                if text.len() > MAX_SCHEMA_BYTES {
                    return Err(GrammarError::TooLarge {
                        len: text.len(),
                        max: MAX_SCHEMA_BYTES,
                    });
                }
                serde_json::from_str(text).map_err(|e| GrammarError::NotJson {
                    reason: e.to_string(),
                })?
            }
        };
        match &mut schema {
            Value::Object(map) => {
                map.insert(
                    "x-guidance".into(),
                    serde_json::json!({
                        "whitespace_flexible": false,
                        "item_separator": ", ",
                        "key_separator": ": ",
                    }),
                );
            }
            // `true` and `false` are schemas too; they need no options.
            Value::Bool(_) => {}
            _ => {
                return Err(GrammarError::Compile {
                    reason: "a schema is an object or a boolean".into(),
                })
            }
        }
        Ok(schema)
    }
}

/// The work llguidance may do for one request, in its own deterministic units (fuel and
/// sizes, never wall-clock time), so that whether a schema is served does not depend on load:
/// past a compile limit the schema is refused naming it; past a step limit the mask fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrammarLimits {
    /// Lexer fuel to build a grammar's lexer (llguidance: about 50k per ms).
    pub initial_lexer_fuel: u64,
    /// Lexer fuel for one token mask (about 14k per ms).
    pub step_lexer_fuel: u64,
    /// Earley items created for one token mask (about 20k per ms).
    pub step_max_items: usize,
    /// Lexer states a grammar may reach (memory: 1-2 kB each).
    pub max_lexer_states: usize,
    /// Symbols in the grammar's productions.
    pub max_grammar_size: usize,
}

impl Default for GrammarLimits {
    /// Chosen with `bench-grammar` (docs/benchmarks.md, "Structured output"): every schema
    /// measured there is served, and one mask costs at most a few milliseconds.
    fn default() -> Self {
        Self {
            initial_lexer_fuel: 1_000_000,
            step_lexer_fuel: 50_000,
            step_max_items: 20_000,
            max_lexer_states: 100_000,
            max_grammar_size: 200_000,
        }
    }
}

/// Compiles constraints over one vocabulary (built once per process: indexing the
/// vocabulary takes tens of milliseconds).
#[derive(Clone)]
pub struct Compiler {
    factory: Arc<ParserFactory>,
    limits: GrammarLimits,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler").finish_non_exhaustive()
    }
}

impl Compiler {
    /// `vocab_size` is the model's logits width (it may exceed the tokenizer's ids); `eos` the
    /// token that ends a finished grammar's output.
    pub fn new(tokens: &TokenBytes, vocab_size: usize, eos: u32) -> Result<Self, GrammarError> {
        Self::with_limits(tokens, vocab_size, eos, GrammarLimits::default())
    }

    /// [`Compiler::new`] with other limits (benchmarks choose them).
    pub fn with_limits(
        tokens: &TokenBytes,
        vocab_size: usize,
        eos: u32,
        limits: GrammarLimits,
    ) -> Result<Self, GrammarError> {
        // Control tokens are marked the way llguidance expects (a 0xff lead byte), so that no
        // text matches them.
        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| match (tokens.is_control(id), tokens.literal(id)) {
                (true, Some(text)) => [&[0xff], text].concat(),
                (false, Some(_)) => tokens.get(id).to_vec(),
                (_, None) => Vec::new(),
            })
            .collect();
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary {
                reason: e.to_string(),
            })?;
        factory.quiet();
        let own = factory.limits_mut();
        own.initial_lexer_fuel = limits.initial_lexer_fuel;
        own.step_lexer_fuel = limits.step_lexer_fuel;
        own.step_max_items = limits.step_max_items;
        own.max_lexer_states = limits.max_lexer_states;
        own.max_grammar_size = limits.max_grammar_size;
        // Errors name the limit, not the request's text.
        own.verbose_errors = false;
        Ok(Self {
            factory: Arc::new(factory),
            limits,
        })
    }

    /// Whether the constraint can be served within the limits, found before any output: it
    /// compiles, and the mask at its first choice (after the text it forces, such as
    /// `{"choice": "` before a large enum's values) stays within the per-mask limits. Masks
    /// further on can still fail (the request then ends with an error); the commonest costly
    /// schemas, a field of many alternatives, are caught here. Deterministic: fuel, not time.
    pub fn check(&self, constraint: &Constraint) -> Result<(), GrammarError> {
        let mut grammar = self.compile(constraint)?;
        // Forced text ends within the schema's size; the bound only guards the loop.
        for _ in 0..MAX_SCHEMA_BYTES {
            let forced = grammar.forced();
            if forced.is_empty() {
                break;
            }
            grammar.accept(&forced).map_err(|e| self.name_limit(e))?;
        }
        grammar
            .draft_masks(&[])
            .map(drop)
            .map_err(|e| self.name_limit(e))
    }

    /// A mask's failure, naming the limit it ran into where llguidance says which.
    fn name_limit(&self, error: GrammarError) -> GrammarError {
        let GrammarError::Failed { reason } = error else {
            return error;
        };
        let (limit, value) = if reason.contains("too many expressions") {
            ("lexer fuel per mask", self.limits.step_lexer_fuel)
        } else if reason.contains("items") {
            ("Earley items per mask", self.limits.step_max_items as u64)
        } else if reason.contains("lexer states") {
            ("lexer states", self.limits.max_lexer_states as u64)
        } else {
            return GrammarError::Failed { reason };
        };
        let reason = reason.replace("<non-verbose/>", "").trim().to_owned();
        GrammarError::OverLimit {
            limit,
            value,
            reason,
        }
    }

    /// `text` in the vocabulary's longest tokens (benchmarks and tests: the model may spell it
    /// otherwise).
    pub fn greedy_tokens(&self, text: &[u8]) -> Vec<u32> {
        self.factory.tok_env().tok_trie().greedy_tokenize(text)
    }

    /// A fresh grammar at the start of the output, or why the constraint cannot be served.
    pub fn compile(&self, constraint: &Constraint) -> Result<Grammar, GrammarError> {
        let grammar = TopLevelGrammar::from_json_schema(constraint.schema()?);
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Compile {
                reason: e.to_string(),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(reason) = matcher.get_error() {
            return Err(GrammarError::Compile { reason });
        }
        Ok(Grammar { matcher })
    }
}

/// Which tokens may come next at one output position.
#[derive(Clone)]
pub struct Mask(SimpleVob);

impl Mask {
    /// A mask that allows `token` alone.
    pub fn only(token: u32) -> Self {
        let mut set = SimpleVob::alloc(token as usize + 1);
        set.allow_token(token);
        Mask(set)
    }

    pub fn allows(&self, token: u32) -> bool {
        token < self.0.len() as u32 && self.0.is_allowed(token)
    }

    /// Sets the logits of every token the mask rules out to `-inf`.
    pub fn apply(&self, logits: &mut [f32]) {
        for (id, logit) in logits.iter_mut().enumerate() {
            if !self.allows(id as u32) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// Tokens it allows.
    pub fn count(&self) -> usize {
        self.0.num_set()
    }
}

impl std::fmt::Debug for Mask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mask({} allowed)", self.count())
    }
}

/// One request's grammar state: where its output is in the constraint.
pub struct Grammar {
    matcher: Matcher,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

fn failed(e: impl std::fmt::Display) -> GrammarError {
    GrammarError::Failed {
        reason: e.to_string(),
    }
}

impl Grammar {
    /// The masks of a verify step's rows: row 0 at the current position, row `i` after
    /// `drafts[..i]`, for as long as the grammar allows the drafts. Returns the masks (one more
    /// than the drafts it allows) and leaves the state where it was.
    pub fn draft_masks(&mut self, drafts: &[u32]) -> Result<Vec<Mask>, GrammarError> {
        let mut masks = Vec::with_capacity(drafts.len() + 1);
        let mut consumed = 0;
        loop {
            let mask = Mask(self.matcher.compute_mask_or_eos().map_err(failed)?);
            let next = drafts.get(consumed).copied();
            let allowed = next.is_some_and(|t| mask.allows(t));
            masks.push(mask);
            match (next, allowed) {
                (Some(t), true) if !self.matcher.is_stopped() => {
                    self.matcher.consume_token(t).map_err(failed)?;
                    consumed += 1;
                }
                _ => break,
            }
        }
        self.matcher.rollback(consumed).map_err(failed)?;
        Ok(masks)
    }

    /// Moves past emitted tokens (each one its mask allowed). A token after the grammar
    /// finished (EOS) changes nothing.
    pub fn accept(&mut self, tokens: &[u32]) -> Result<(), GrammarError> {
        for &t in tokens {
            if self.matcher.is_stopped() {
                break;
            }
            self.matcher.consume_token(t).map_err(failed)?;
        }
        Ok(())
    }

    /// Drafts for the text the grammar forces from here (`{"name": "` after `{`, say): the
    /// forced bytes in the vocabulary's longest tokens. The model may spell them otherwise;
    /// they are drafts, verified like any. Empty when nothing is forced.
    pub fn forced(&mut self) -> Vec<u32> {
        if self.matcher.is_stopped() {
            return Vec::new();
        }
        let bytes = self.matcher.compute_ff_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        match self.matcher.tok_env() {
            Ok(env) => env.tok_trie().greedy_tokenize(&bytes),
            Err(_) => Vec::new(),
        }
    }

    /// The output so far completes the constraint.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests;
