//! `POST /v1/completions`: the [`Completions`] flavour of the generation route.

use super::generation::Flavour;
use crate::error::ApiError;
use crate::generate::ChoiceEnd;
use crate::model::ModelAssets;
use crate::openai::logprobs::{CompletionLogprobs, LogprobEntry};
use crate::openai::requests::CompletionRequest;
use crate::openai::responses::CompletionChoice;
use crate::openai::validate::{
    completion_logprobs, completion_prompts, generate_spec, refuse_unknown, DefaultMaxTokens,
    GenerateSpec, Limits,
};

/// vLLM's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;

fn unsupported_fields(req: &CompletionRequest) -> Result<(), ApiError> {
    refuse_unknown(&req.unknown, "")?;
    if req.suffix.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    if req
        .best_of
        .is_some_and(|b| Some(b) != req.sampling.n.or(Some(1)))
    {
        return Err(ApiError::invalid("best_of", "best_of must equal n"));
    }
    Ok(())
}

pub struct Completions;

impl Flavour for Completions {
    type Request = CompletionRequest;
    type Choice = CompletionChoice;
    type ChunkChoice = CompletionChoice;
    const ID_PREFIX: &'static str = "cmpl";
    const OBJECT: &'static str = "text_completion";
    const CHUNK_OBJECT: &'static str = "text_completion";

    fn model(request: &CompletionRequest) -> Option<&str> {
        request.model.as_deref()
    }

    fn sampling(request: &CompletionRequest) -> &crate::openai::requests::SamplingFields {
        &request.sampling
    }

    fn spec(
        req: CompletionRequest,
        model: &ModelAssets,
        limits: &Limits,
    ) -> Result<GenerateSpec, ApiError> {
        unsupported_fields(&req)?;
        let logprobs = completion_logprobs(req.logprobs.as_ref())?;
        let prompts = completion_prompts(&req.prompt, &model.tokenizer, limits)?;
        let mut spec = generate_spec(
            prompts,
            &req.sampling,
            req.sampling.max_tokens,
            DefaultMaxTokens::Fixed(DEFAULT_MAX_TOKENS),
            &model.tokenizer,
            limits,
        )?;
        spec.sampling.logprobs = logprobs;
        spec.echo = req.echo.unwrap_or(false);
        if spec.echo {
            // The prompt's logprobs, with as many alternatives as the output's.
            spec.sampling.prompt_logprobs = logprobs;
        }
        Ok(spec)
    }

    fn opening(_index: u32) -> Option<CompletionChoice> {
        None
    }

    fn text_chunk(
        index: u32,
        text: String,
        logprobs: Option<Vec<LogprobEntry>>,
    ) -> CompletionChoice {
        CompletionChoice {
            index,
            text,
            logprobs: logprobs.as_deref().map(CompletionLogprobs::new),
            finish_reason: None,
            stop_reason: None,
            speculate_metrics: None,
        }
    }

    fn end_chunk(end: &ChoiceEnd) -> CompletionChoice {
        CompletionChoice {
            index: end.index,
            text: end.text.clone(),
            logprobs: end.logprobs.as_deref().map(CompletionLogprobs::new),
            finish_reason: Some(end.finish_reason),
            stop_reason: end.stop_reason.clone(),
            speculate_metrics: end.speculate_metrics.clone(),
        }
    }

    fn choice(text: String, end: ChoiceEnd) -> CompletionChoice {
        CompletionChoice {
            index: end.index,
            text,
            logprobs: end.logprobs.as_deref().map(CompletionLogprobs::new),
            finish_reason: Some(end.finish_reason),
            stop_reason: end.stop_reason,
            speculate_metrics: end.speculate_metrics,
        }
    }
}
