//! Turns a parsed request into engine parameters, rejecting every value the engine cannot honour
//! with a 400 that names the field.

use grammar::Constraint;
use proto::api_worker::{LogitsProcessors, SamplingParams, StopConditions, StructuredOutput};

use serde_json::Value;

use super::requests::{
    ChatCompletionRequest, ChatMessage, MessageContent, PromptInput, SamplingFields, StopInput,
    UnknownFields,
};
use crate::error::ApiError;
use crate::template::{ChatTemplate, TemplateMessage};
use crate::tokenizer::Tokenizer;

/// Most `logit_bias` entries a request may carry (the worker's bound).
const MAX_LOGIT_BIAS: usize = 1024;

/// Caps on what one request may ask for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Context length: prompt plus completion tokens.
    pub max_model_len: u32,
    pub max_n: u32,
    /// Prompts in one completion request (each times `n` engine requests).
    pub max_prompts: usize,
    /// Engine sequences (prompts × `n`) one request may start, so that no single request can
    /// fill a worker's queue and lock every other client out.
    pub max_sequences: usize,
    pub max_stop_strings: usize,
    pub max_stop_bytes: usize,
    pub max_messages: usize,
}

impl Limits {
    pub fn new(max_model_len: u32) -> Self {
        Self {
            max_model_len,
            max_n: 16,
            max_prompts: 64,
            max_sequences: crate::engine::admission::MAX_SEQUENCES_PER_REQUEST,
            max_stop_strings: 16,
            max_stop_bytes: 256,
            max_messages: 1024,
        }
    }
}

/// What the engine is asked to generate for one HTTP request.
#[derive(Debug, Clone)]
pub struct GenerateSpec {
    /// One entry per prompt; each runs `n` times.
    pub prompts: Vec<Vec<u32>>,
    /// Completion budget per prompt.
    pub max_tokens: Vec<u32>,
    pub n: u32,
    pub sampling: SamplingParams,
    pub stop: StopConditions,
    pub stream: bool,
    pub include_usage: bool,
    /// Logprobs name tokens as `token_id:<id>` (vLLM's `return_tokens_as_token_ids`).
    pub tokens_as_ids: bool,
    /// Each choice's text starts with its prompt's (completions' `echo`), and its logprobs
    /// with the prompt's when it asked for logprobs.
    pub echo: bool,
    /// The request's class: `metadata.class` as sent, until the route resolves it (a header
    /// the operator names wins, and a class that is not configured is `other`).
    pub class: String,
}

/// `max_tokens` when the request gives none.
#[derive(Debug, Clone, Copy)]
pub enum DefaultMaxTokens {
    /// vLLM's completions default (16).
    Fixed(u32),
    /// Chat: whatever the context leaves.
    RestOfContext,
}

/// The request's `model` must name the served model (or be absent).
pub fn check_model(requested: Option<&str>, names: &[String]) -> Result<(), ApiError> {
    match requested {
        Some(name) if !names.iter().any(|n| n == name) => {
            // Clients may send anything here; keep the echo short.
            let model: String = name.chars().take(128).collect();
            Err(ApiError::ModelNotFound { model })
        }
        _ => Ok(()),
    }
}

/// Token ids given by a client (field `param`), each inside the vocabulary.
pub fn token_ids(
    param: &'static str,
    ids: &[i64],
    tokenizer: &Tokenizer,
) -> Result<Vec<u32>, ApiError> {
    let vocab = tokenizer.vocab_size() as i64;
    ids.iter()
        .map(|&id| {
            if (0..vocab).contains(&id) {
                Ok(id as u32)
            } else {
                Err(ApiError::invalid(
                    param,
                    format!("token id {id} is outside the vocabulary (0..{vocab})"),
                ))
            }
        })
        .collect()
}

/// Tokenized completion prompts.
pub fn completion_prompts(
    prompt: &PromptInput,
    tokenizer: &Tokenizer,
    limits: &Limits,
) -> Result<Vec<Vec<u32>>, ApiError> {
    // Counted before any tokenization: a request over the cap costs no work.
    let count = match prompt {
        PromptInput::Text(_) | PromptInput::Ids(_) => 1,
        PromptInput::Texts(texts) => texts.len(),
        PromptInput::IdLists(lists) => lists.len(),
    };
    if count > limits.max_prompts {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {} prompts per request", limits.max_prompts),
        ));
    }
    let prompts = match prompt {
        PromptInput::Text(text) => vec![tokenizer.encode_prompt(text)?],
        PromptInput::Texts(texts) => texts
            .iter()
            .map(|t| tokenizer.encode_prompt(t))
            .collect::<Result<Vec<_>, _>>()?,
        PromptInput::Ids(ids) => vec![token_ids("prompt", ids, tokenizer)?],
        PromptInput::IdLists(lists) => lists
            .iter()
            .map(|ids| token_ids("prompt", ids, tokenizer))
            .collect::<Result<Vec<_>, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "prompt must not be empty"));
    }
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid("prompt", "prompt must not be empty"));
    }
    Ok(prompts)
}

/// Refuses the first field of `unknown` (named with `prefix`, e.g. `messages[2].`).
pub fn refuse_unknown(unknown: &UnknownFields, prefix: &str) -> Result<(), ApiError> {
    match unknown.keys().next() {
        None => Ok(()),
        Some(field) => {
            // Clients choose the name; keep the echo short.
            let field: String = field.chars().take(64).collect();
            Err(ApiError::unsupported(
                format!("{prefix}{field}"),
                "this server does not serve this field (see the README's list of request fields)",
            ))
        }
    }
}

fn message_text(message: &ChatMessage) -> Result<String, ApiError> {
    match &message.content {
        // OpenAI allows an assistant turn without content (it then carries tool calls, which
        // are refused); every other role must say something.
        None if message.role == "assistant" => Ok(String::new()),
        None => Err(ApiError::invalid(
            "messages",
            format!("a {} message must have content", message.role),
        )),
        Some(MessageContent::Text(text)) => Ok(text.clone()),
        Some(MessageContent::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(text)) => texts.push(text.as_str()),
                    _ => {
                        return Err(ApiError::invalid(
                            "messages",
                            "only text content parts are supported",
                        ))
                    }
                }
            }
            // vLLM joins text parts with newlines.
            Ok(texts.join("\n"))
        }
    }
}

/// Renders and tokenizes a chat prompt.
pub fn chat_prompt(
    request: &ChatCompletionRequest,
    template: Option<&ChatTemplate>,
    tokenizer: &Tokenizer,
    limits: &Limits,
) -> Result<Vec<u32>, ApiError> {
    refuse_unknown(&request.unknown, "")?;
    if request.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid("tools", "tool calling is not supported"));
    }
    match &request.tool_choice {
        None | Some(Value::Null) => {}
        Some(Value::String(choice)) if choice == "none" => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool calling is not supported; tool_choice may only be \"none\"",
            ))
        }
    }
    let add_generation_prompt = request.add_generation_prompt.unwrap_or(true);
    let text = render_chat(
        &request.messages,
        add_generation_prompt,
        template,
        tokenizer,
        limits,
    )?;
    // The template wrote the special tokens; add none (vLLM's add_special_tokens=False).
    let ids = tokenizer.encode_chat(&text, false)?;
    if ids.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "the rendered prompt is empty",
        ));
    }
    Ok(ids)
}

/// The chat template applied to `messages`, each checked (role, content, no unknown fields).
/// Content is quoted ([`Tokenizer::quote_content`]): encode the result with
/// [`Tokenizer::encode_chat`], so that a user's `<|im_start|>` stays text.
pub fn render_chat(
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    template: Option<&ChatTemplate>,
    tokenizer: &Tokenizer,
    limits: &Limits,
) -> Result<String, ApiError> {
    let template = template.ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "this model has no chat template; use /v1/completions",
        )
    })?;
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    if messages.len() > limits.max_messages {
        return Err(ApiError::invalid(
            "messages",
            format!("at most {} messages per request", limits.max_messages),
        ));
    }
    let mut rendered = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        refuse_unknown(&m.unknown, &format!("messages[{i}]."))?;
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "developer" | "tool"
        ) {
            return Err(ApiError::invalid("messages", "unknown message role"));
        }
        rendered.push(TemplateMessage {
            role: m.role.clone(),
            content: tokenizer.quote_content(&message_text(m)?),
        });
    }
    template.render(&rendered, add_generation_prompt)
}

fn finite_in(
    param: &'static str,
    value: Option<f64>,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> Result<Option<f64>, ApiError> {
    match value {
        Some(v) if !v.is_finite() || !ok(v) => {
            Err(ApiError::invalid(param, format!("{param} must be {range}")))
        }
        other => Ok(other),
    }
}

fn stop_strings(stop: &Option<StopInput>, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => Vec::new(),
        Some(StopInput::One(s)) => vec![s.clone()],
        Some(StopInput::Many(v)) => v.clone(),
    };
    if list.len() > limits.max_stop_strings {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {} stop strings", limits.max_stop_strings),
        ));
    }
    if list.iter().any(|s| s.len() > limits.max_stop_bytes) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "stop strings are limited to {} bytes",
                limits.max_stop_bytes
            ),
        ));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Checks the sampling and stopping fields and sizes each prompt's completion budget. The
/// checks run in the fields' order, so a request with several bad fields names the same one.
pub fn generate_spec(
    prompts: Vec<Vec<u32>>,
    fields: &SamplingFields,
    max_tokens: Option<i64>,
    default_max_tokens: DefaultMaxTokens,
    tokenizer: &Tokenizer,
    limits: &Limits,
) -> Result<GenerateSpec, ApiError> {
    let sampling = sampling_params(fields, tokenizer)?;
    let n = choice_count(fields.n, prompts.len(), limits)?;
    if fields.user.as_ref().is_some_and(|u| u.len() > 1024) {
        return Err(ApiError::invalid("user", "user is limited to 1024 bytes"));
    }
    let stop_token_ids = stop_token_ids(fields.stop_token_ids.as_deref(), tokenizer)?;
    let (stream, include_usage) = stream_flags(fields)?;
    let budgets = prompts
        .iter()
        .map(|prompt| completion_budget(prompt.len(), max_tokens, default_max_tokens, limits))
        .collect::<Result<Vec<_>, _>>()?;
    let stop_strings = stop_strings(&fields.stop, limits)?;
    let min_tokens = sampling.processors.min_tokens;
    if budgets.iter().any(|&budget| min_tokens > budget) {
        return Err(ApiError::invalid(
            "min_tokens",
            "min_tokens must not exceed max_tokens",
        ));
    }
    Ok(GenerateSpec {
        prompts,
        max_tokens: budgets,
        n,
        sampling,
        stop: StopConditions {
            stop_token_ids,
            ignore_eos: fields.ignore_eos.unwrap_or(false),
            stop_strings,
        },
        stream,
        include_usage,
        tokens_as_ids: fields.return_tokens_as_token_ids.unwrap_or(false),
        echo: false,
        class: metadata_class(fields.metadata.as_ref()),
    })
}

/// Chat's `logprobs` and `top_logprobs` as the engine's `logprobs`: `Some(top)` when
/// `logprobs` is true. `top_logprobs` (0 to 20) needs `logprobs` true (OpenAI's and vLLM's
/// rule).
pub fn chat_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<Option<u8>, ApiError> {
    let max = i64::from(proto::MAX_TOP_LOGPROBS);
    match (logprobs.unwrap_or(false), top) {
        (_, Some(n)) if !(0..=max).contains(&n) => Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs must be between 0 and {max}"),
        )),
        (false, Some(_)) => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs set to true",
        )),
        (false, None) => Ok(None),
        (true, top) => Ok(Some(top.unwrap_or(0) as u8)),
    }
}

/// Completions' `logprobs` (null, or how many alternatives, 0 to 20) as the engine's.
pub fn completion_logprobs(logprobs: Option<&Value>) -> Result<Option<u8>, ApiError> {
    let max = u64::from(proto::MAX_TOP_LOGPROBS);
    match logprobs {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max => Ok(Some(n as u8)),
            _ => Err(ApiError::invalid(
                "logprobs",
                format!("logprobs must be null or an integer between 0 and {max}"),
            )),
        },
    }
}

/// Temperature, top-p, top-k, seed and the logits processors; `response_format` and
/// `metadata` are checked here too.
fn sampling_params(
    fields: &SamplingFields,
    tokenizer: &Tokenizer,
) -> Result<SamplingParams, ApiError> {
    let temperature = finite_in(
        "temperature",
        fields.temperature,
        |t| (0.0..=2.0).contains(&t),
        "between 0 and 2",
    )?;
    let top_p = finite_in("top_p", fields.top_p, |p| p > 0.0 && p <= 1.0, "in (0, 1]")?;
    let processors = logits_processors(fields, tokenizer)?;
    let structured = response_format(fields.response_format.as_ref(), tokenizer)?;
    if structured.is_some() && fields.ignore_eos == Some(true) {
        return Err(ApiError::invalid(
            "ignore_eos",
            "ignore_eos cannot be combined with a JSON response_format, which ends at EOS",
        ));
    }
    metadata(fields.metadata.as_ref())?;
    let top_k = match fields.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 && k <= tokenizer.vocab_size() as i64 => k as u32,
        Some(_) => {
            return Err(ApiError::invalid(
                "top_k",
                "top_k must be -1, 0 or a positive vocabulary size at most",
            ))
        }
    };
    Ok(SamplingParams {
        temperature: temperature.unwrap_or(1.0) as f32,
        top_p: top_p.unwrap_or(1.0) as f32,
        top_k,
        seed: fields.seed.map(|s| s as u64),
        processors,
        logprobs: None,
        prompt_logprobs: None,
        structured,
    })
}

/// Penalties, min-p, min_tokens and logit bias, in vLLM's ranges.
fn logits_processors(
    fields: &SamplingFields,
    tokenizer: &Tokenizer,
) -> Result<LogitsProcessors, ApiError> {
    let penalty = |param, value| {
        finite_in(
            param,
            value,
            |v| (-2.0..=2.0).contains(&v),
            "between -2 and 2",
        )
        .map(|v| v.unwrap_or(0.0) as f32)
    };
    let presence_penalty = penalty("presence_penalty", fields.presence_penalty)?;
    let frequency_penalty = penalty("frequency_penalty", fields.frequency_penalty)?;
    let repetition_penalty = finite_in(
        "repetition_penalty",
        fields.repetition_penalty,
        |v| v > 0.0 && v <= 2.0,
        "in (0, 2]",
    )?
    .unwrap_or(1.0) as f32;
    let min_p = finite_in(
        "min_p",
        fields.min_p,
        |v| (0.0..=1.0).contains(&v),
        "in [0, 1]",
    )?
    .unwrap_or(0.0) as f32;
    let min_tokens = match fields.min_tokens {
        None => 0,
        Some(m) if (0..=i64::from(u32::MAX)).contains(&m) => m as u32,
        Some(_) => return Err(ApiError::invalid("min_tokens", "min_tokens must be >= 0")),
    };
    if min_tokens > 0 && stop_list_given(&fields.stop) {
        return Err(ApiError::invalid(
            "min_tokens",
            "min_tokens together with stop strings is not supported yet",
        ));
    }
    Ok(LogitsProcessors {
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        min_p,
        min_tokens,
        logit_bias: logit_bias(fields.logit_bias.as_ref(), tokenizer)?,
        bad_words: bad_words(fields.bad_words.as_deref(), tokenizer)?,
    })
}

/// `bad_words` (vLLM's): each word as its tokens, alone and after a space (so it is ruled out
/// at the start of the text and inside it); the engine rules out a sequence's last token
/// wherever the output ends with the rest.
fn bad_words(words: Option<&[String]>, tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    use proto::api_worker::{MAX_BAD_WORDS, MAX_BAD_WORD_TOKENS};
    let words = words.unwrap_or_default();
    // Counts and sizes before any tokenizing: each word is at least one sequence of its own.
    if words.len() > MAX_BAD_WORDS {
        return Err(ApiError::invalid(
            "bad_words",
            format!("at most {MAX_BAD_WORDS} bad_words"),
        ));
    }
    let too_long = || {
        ApiError::invalid(
            "bad_words",
            format!("a bad word is at most {MAX_BAD_WORD_TOKENS} tokens"),
        )
    };
    if words
        .iter()
        .any(|w| tokenizer.exceeds_tokens(w, MAX_BAD_WORD_TOKENS))
    {
        return Err(too_long());
    }
    let mut sequences: Vec<Vec<u32>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for word in words {
        let word = word.trim_start();
        if word.is_empty() {
            return Err(ApiError::invalid(
                "bad_words",
                "bad_words must not be empty strings",
            ));
        }
        for text in [word.to_owned(), format!(" {word}")] {
            let ids = tokenizer.encode(&text)?;
            if ids.len() > MAX_BAD_WORD_TOKENS {
                return Err(too_long());
            }
            if !ids.is_empty() && seen.insert(ids.clone()) {
                sequences.push(ids);
            }
        }
    }
    if sequences.len() > MAX_BAD_WORDS {
        return Err(ApiError::invalid(
            "bad_words",
            format!("bad_words tokenize to more than {MAX_BAD_WORDS} sequences"),
        ));
    }
    Ok(sequences)
}

fn stop_list_given(stop: &Option<StopInput>) -> bool {
    match stop {
        None => false,
        Some(StopInput::One(s)) => !s.is_empty(),
        Some(StopInput::Many(v)) => v.iter().any(|s| !s.is_empty()),
    }
}

/// `logit_bias`: token ids (as JSON object keys) to a bias in [-100, 100], as OpenAI defines it.
fn logit_bias(bias: Option<&Value>, tokenizer: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let entries = match bias {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(entries)) => entries,
        Some(_) => {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias must map token ids to numbers",
            ))
        }
    };
    if entries.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("at most {MAX_LOGIT_BIAS} logit_bias entries"),
        ));
    }
    let vocab = tokenizer.vocab_size();
    entries
        .iter()
        .map(|(key, value)| {
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias keys must be token ids below {vocab}"),
                    )
                })?;
            let bias = value
                .as_f64()
                .filter(|b| b.is_finite() && (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        "logit_bias values must be between -100 and 100",
                    )
                })?;
            Ok((id, bias as f32))
        })
        .collect()
}

/// `response_format`: `text` (free), `json_object` (any JSON object) or `json_schema`
/// (`{"name", "schema", "strict"}`: JSON matching `schema`; `strict` is accepted either way, as
/// the schema is always enforced). A schema the grammar engine cannot compile is a 400 naming
/// why, here rather than after admission.
fn response_format(
    format: Option<&Value>,
    tokenizer: &Tokenizer,
) -> Result<Option<StructuredOutput>, ApiError> {
    let invalid = |message: String| ApiError::invalid("response_format", message);
    let format = match format {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(format)) => format,
        Some(_) => return Err(invalid("response_format must be an object".into())),
    };
    let known = ["type", "json_schema"];
    if let Some(field) = format.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(invalid(format!("unknown field response_format.{field}")));
    }
    let structured = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => StructuredOutput::JsonObject,
        Some("json_schema") => {
            StructuredOutput::JsonSchema(json_schema(format.get("json_schema"))?)
        }
        _ => {
            return Err(invalid(
                "response_format.type must be text, json_object or json_schema".into(),
            ))
        }
    };
    let constraint = match &structured {
        StructuredOutput::JsonObject => Constraint::JsonObject,
        StructuredOutput::JsonSchema(schema) => Constraint::JsonSchema(schema.clone()),
    };
    let compiler = tokenizer
        .grammars()
        .ok_or_else(|| invalid("structured output is not available for this model".into()))?;
    compiler
        .check(&constraint)
        .map_err(|e| invalid(e.to_string()))?;
    Ok(Some(structured))
}

/// `response_format.json_schema`: the schema's text.
fn json_schema(spec: Option<&Value>) -> Result<String, ApiError> {
    let invalid = |message: &str| ApiError::invalid("response_format", message.to_string());
    let Some(Value::Object(spec)) = spec else {
        return Err(invalid("response_format.json_schema must be an object"));
    };
    let known = ["name", "description", "schema", "strict"];
    if let Some(field) = spec.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(invalid(&format!(
            "unknown field response_format.json_schema.{field}"
        )));
    }
    if spec.get("name").is_some_and(|n| !n.is_string()) {
        return Err(invalid("response_format.json_schema.name must be a string"));
    }
    if spec
        .get("strict")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(invalid(
            "response_format.json_schema.strict must be a boolean",
        ));
    }
    match spec.get("schema") {
        Some(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(schema.to_string()),
        _ => Err(invalid(
            "response_format.json_schema.schema must be a JSON schema object",
        )),
    }
}

/// `metadata.class`, the request's class as the client names it ("" without one); only a
/// configured class labels the acceptance series (`--request-classes`).
fn metadata_class(metadata: Option<&Value>) -> String {
    metadata
        .and_then(|m| m.get("class"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// `metadata`: within OpenAI's bounds (16 pairs, keys of 64 characters, string values of
/// 512); its `class` names the request's class, the rest has no effect.
fn metadata(metadata: Option<&Value>) -> Result<(), ApiError> {
    let pairs = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(pairs)) => pairs,
        Some(_) => return Err(ApiError::invalid("metadata", "metadata must be an object")),
    };
    let fits = pairs.len() <= 16
        && pairs.iter().all(|(key, value)| {
            key.chars().count() <= 64 && value.as_str().is_some_and(|v| v.chars().count() <= 512)
        });
    if fits {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "metadata",
            "metadata holds at most 16 pairs, keys of at most 64 characters and string values of at most 512",
        ))
    }
}

/// `n`, within its cap and the cap on sequences (prompts × `n`) per request.
fn choice_count(n: Option<i64>, prompts: usize, limits: &Limits) -> Result<u32, ApiError> {
    let n = match n {
        None => 1,
        Some(n) if n >= 1 && n <= i64::from(limits.max_n) => n as u32,
        Some(_) => {
            return Err(ApiError::invalid(
                "n",
                format!("n must be between 1 and {}", limits.max_n),
            ))
        }
    };
    if prompts * n as usize > limits.max_sequences {
        return Err(ApiError::invalid(
            "n",
            format!(
                "prompts × n is {} here; at most {} sequences per request",
                prompts * n as usize,
                limits.max_sequences
            ),
        ));
    }
    Ok(n)
}

fn stop_token_ids(ids: Option<&[i64]>, tokenizer: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    match ids {
        None => Ok(Vec::new()),
        Some(ids) if ids.len() > 256 => Err(ApiError::invalid(
            "stop_token_ids",
            "at most 256 stop token ids",
        )),
        Some(ids) => ids
            .iter()
            .map(|&id| {
                u32::try_from(id)
                    .ok()
                    .filter(|&id| (id as usize) < tokenizer.vocab_size())
                    .ok_or_else(|| {
                        ApiError::invalid("stop_token_ids", "stop token id outside the vocabulary")
                    })
            })
            .collect(),
    }
}

/// `stream`, and whether the stream ends with a usage chunk.
fn stream_flags(fields: &SamplingFields) -> Result<(bool, bool), ApiError> {
    let stream = fields.stream.unwrap_or(false);
    if fields.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options requires stream=true",
        ));
    }
    let include_usage = fields
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    Ok((stream, include_usage))
}

/// The completion budget of a prompt of `len` tokens: what the request asks for, if the
/// context has room for it, else the default.
fn completion_budget(
    len: usize,
    max_tokens: Option<i64>,
    default_max_tokens: DefaultMaxTokens,
    limits: &Limits,
) -> Result<u32, ApiError> {
    let ctx = limits.max_model_len;
    let len = len as u64;
    if len >= u64::from(ctx) {
        return Err(ApiError::ContextLength {
            param: "prompt",
            message: format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt has {len} tokens."
            ),
        });
    }
    let room = ctx - len as u32;
    match (max_tokens, default_max_tokens) {
        (Some(m), _) if m < 1 => Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1")),
        (Some(m), _) if m > i64::from(room) => Err(ApiError::ContextLength {
            param: "max_tokens",
            message: format!(
                "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({len} in the prompt, {m} for the completion).",
                i128::from(len) + i128::from(m)
            ),
        }),
        (Some(m), _) => Ok(m as u32),
        (None, DefaultMaxTokens::Fixed(d)) => Ok(d.min(room)),
        (None, DefaultMaxTokens::RestOfContext) => Ok(room),
    }
}
