//! `POST /tokenize` and `POST /detokenize`, in vLLM's request and response shapes: what the
//! server would feed the model for a prompt or a chat, and the text of token ids.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;

use super::AppState;
use crate::body::{read_json, Parsed};
use crate::engine::ServingEngine;
use crate::error::ApiError;
use crate::model::ModelAssets;
use crate::openai::requests::{DetokenizeRequest, TokenizeRequest};
use crate::openai::responses::{DetokenizeResponse, TokenizeResponse};
use crate::openai::validate::{check_model, refuse_unknown, render_chat, token_ids, Limits};

pub async fn tokenize<E: ServingEngine>(
    State(state): State<AppState<E>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let Parsed { value: req, heavy } =
        read_json::<TokenizeRequest>(&headers, body, &state.body).await?;
    check_model(req.model.as_deref(), &state.model_names)?;
    let (assets, limits) = (state.model.clone(), state.limits());
    let response = state
        .body
        .run(heavy, move || tokenize_request(&req, &assets, &limits))
        .await?;
    Ok(Json(response))
}

fn tokenize_request(
    req: &TokenizeRequest,
    model: &ModelAssets,
    limits: &Limits,
) -> Result<TokenizeResponse, ApiError> {
    refuse_unknown(&req.unknown, "")?;
    let tokenizer = &model.tokenizer;
    let max_tokens = limits.max_model_len as usize;
    let tokens = match (&req.prompt, &req.messages) {
        (Some(prompt), None) => {
            refuse_longer_than_context("prompt", prompt, tokenizer, max_tokens)?;
            if req.add_generation_prompt.is_some() {
                return Err(ApiError::invalid(
                    "add_generation_prompt",
                    "add_generation_prompt applies to messages, not to a prompt",
                ));
            }
            match req.add_special_tokens.unwrap_or(true) {
                true => tokenizer.encode_prompt(prompt)?,
                false => tokenizer.encode(prompt)?,
            }
        }
        (None, Some(messages)) => {
            let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
            let text = render_chat(
                messages,
                add_generation_prompt,
                model.chat_template.as_ref(),
                tokenizer,
                limits,
            )?;
            refuse_longer_than_context("messages", &text, tokenizer, max_tokens)?;
            tokenizer.encode_chat(&text, req.add_special_tokens.unwrap_or(false))?
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of prompt and messages",
            ))
        }
    };
    if tokens.len() > max_tokens {
        return Err(too_long(
            if req.prompt.is_some() {
                "prompt"
            } else {
                "messages"
            },
            max_tokens,
        ));
    }
    let token_strs = req.return_token_strs.unwrap_or(false).then(|| {
        tokens
            .iter()
            .map(|&id| tokenizer.token_text(id).unwrap_or_default())
            .collect()
    });
    Ok(TokenizeResponse {
        count: tokens.len(),
        max_model_len: limits.max_model_len,
        tokens,
        token_strs,
    })
}

/// What `/tokenize` answers is bounded by the model's context, as a generation's prompt is:
/// text that is certainly longer is refused before it is tokenized.
fn refuse_longer_than_context(
    param: &'static str,
    text: &str,
    tokenizer: &crate::tokenizer::Tokenizer,
    max_tokens: usize,
) -> Result<(), ApiError> {
    match tokenizer.exceeds_tokens(text, max_tokens) {
        true => Err(too_long(param, max_tokens)),
        false => Ok(()),
    }
}

fn too_long(param: &'static str, max_tokens: usize) -> ApiError {
    ApiError::invalid(
        param,
        format!("more than the model's context of {max_tokens} tokens"),
    )
}

pub async fn detokenize<E: ServingEngine>(
    State(state): State<AppState<E>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let Parsed { value: req, heavy } =
        read_json::<DetokenizeRequest>(&headers, body, &state.body).await?;
    check_model(req.model.as_deref(), &state.model_names)?;
    let assets = state.model.clone();
    let prompt = state
        .body
        .run(heavy, move || {
            refuse_unknown(&req.unknown, "")?;
            let ids = token_ids("tokens", &req.tokens, &assets.tokenizer)?;
            // Special tokens stay in the text, as vLLM's detokenize writes them.
            Ok::<_, ApiError>(assets.tokenizer.decode(&ids, false))
        })
        .await?;
    Ok(Json(DetokenizeResponse { prompt }))
}
