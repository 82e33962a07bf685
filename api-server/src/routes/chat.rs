//! `POST /v1/chat/completions`: the [`Chat`] flavour of the generation route.

use super::generation::Flavour;
use crate::error::ApiError;
use crate::generate::ChoiceEnd;
use crate::model::ModelAssets;
use crate::openai::logprobs::{ChatLogprobs, LogprobEntry};
use crate::openai::requests::ChatCompletionRequest;
use crate::openai::responses::{AssistantMessage, ChatChoice, ChatChunkChoice, Delta};
use crate::openai::validate::{
    chat_logprobs, chat_prompt, generate_spec, DefaultMaxTokens, GenerateSpec, Limits,
};

pub struct Chat;

impl Flavour for Chat {
    type Request = ChatCompletionRequest;
    type Choice = ChatChoice;
    type ChunkChoice = ChatChunkChoice;
    const ID_PREFIX: &'static str = "chatcmpl";
    const OBJECT: &'static str = "chat.completion";
    const CHUNK_OBJECT: &'static str = "chat.completion.chunk";

    fn model(request: &ChatCompletionRequest) -> Option<&str> {
        request.model.as_deref()
    }

    fn sampling(request: &ChatCompletionRequest) -> &crate::openai::requests::SamplingFields {
        &request.sampling
    }

    fn spec(
        req: ChatCompletionRequest,
        model: &ModelAssets,
        limits: &Limits,
    ) -> Result<GenerateSpec, ApiError> {
        let tokenizer = &model.tokenizer;
        let prompt = chat_prompt(&req, model.chat_template.as_ref(), tokenizer, limits)?;
        // `max_completion_tokens` is the newer name; it wins when both are given.
        let max_tokens = req.max_completion_tokens.or(req.sampling.max_tokens);
        let logprobs = chat_logprobs(req.logprobs, req.top_logprobs)?;
        let mut spec = generate_spec(
            vec![prompt],
            &req.sampling,
            max_tokens,
            DefaultMaxTokens::RestOfContext,
            tokenizer,
            limits,
        )?;
        spec.sampling.logprobs = logprobs;
        Ok(spec)
    }

    /// vLLM opens each choice with the assistant role and empty content.
    fn opening(index: u32) -> Option<ChatChunkChoice> {
        Some(chunk_choice(
            index,
            Delta {
                role: Some("assistant"),
                content: Some(String::new()),
            },
        ))
    }

    fn text_chunk(
        index: u32,
        text: String,
        logprobs: Option<Vec<LogprobEntry>>,
    ) -> ChatChunkChoice {
        ChatChunkChoice {
            logprobs: logprobs.as_deref().map(ChatLogprobs::new),
            ..chunk_choice(
                index,
                Delta {
                    role: None,
                    content: Some(text),
                },
            )
        }
    }

    fn end_chunk(end: &ChoiceEnd) -> ChatChunkChoice {
        let content = (!end.text.is_empty()).then(|| end.text.clone());
        ChatChunkChoice {
            finish_reason: Some(end.finish_reason),
            stop_reason: end.stop_reason.clone(),
            speculate_metrics: end.speculate_metrics.clone(),
            logprobs: end.logprobs.as_deref().map(ChatLogprobs::new),
            ..chunk_choice(
                end.index,
                Delta {
                    role: None,
                    content,
                },
            )
        }
    }

    fn choice(text: String, end: ChoiceEnd) -> ChatChoice {
        ChatChoice {
            index: end.index,
            message: AssistantMessage {
                role: "assistant",
                content: text,
            },
            logprobs: end.logprobs.as_deref().map(ChatLogprobs::new),
            finish_reason: Some(end.finish_reason),
            stop_reason: end.stop_reason,
            speculate_metrics: end.speculate_metrics,
        }
    }
}

/// A chunk choice that does not end its choice.
fn chunk_choice(index: u32, delta: Delta) -> ChatChunkChoice {
    ChatChunkChoice {
        index,
        delta,
        logprobs: None,
        finish_reason: None,
        stop_reason: None,
        speculate_metrics: None,
    }
}
