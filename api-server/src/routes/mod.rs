//! The HTTP surface: OpenAI routes, `/health`, and the envelope for unknown routes and methods.

pub mod chat;
pub mod completions;
pub mod generation;
pub mod health;
pub mod models;
pub mod tokenize;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

use crate::auth::{require_api_key, ApiKey};
use crate::body::BodyLimits;
use crate::engine::{EngineClient, ServingEngine};
use crate::error::ApiError;
use crate::memory::{track_activity, IdleTrim};
use crate::model::ModelAssets;
use crate::openai::validate::Limits;
use crate::origin::{check_origin, AllowedOrigins};
use crate::request_class::RequestClasses;

/// Everything a handler needs; cheap to clone. `E` is the engine: the ZeroMQ client in the
/// product, an in-process fake in route tests.
#[derive(Clone)]
pub struct AppState<E = EngineClient> {
    pub model: Arc<ModelAssets>,
    /// The name clients use in `model`.
    pub served_model_name: Arc<str>,
    /// Names a request's `model` may use (the served name first).
    pub model_names: Arc<[String]>,
    /// Where the model came from (`root` in `/v1/models`).
    pub model_root: Arc<str>,
    /// Caps; `max_model_len` is the configured upper bound (see [`AppState::limits`]).
    pub limits: Arc<Limits>,
    pub engine: E,
    pub request_timeout: Duration,
    /// Web origins whose pages may call the API (`--allowed-origins`).
    pub allowed_origins: AllowedOrigins,
    /// A stream whose client reads nothing for this long is dropped and its sequences freed.
    pub stream_write_timeout: Duration,
    /// How request bodies are read: size, deadline, heavy ones off the runtime.
    pub body: BodyLimits,
    pub started_unix: u64,
    /// Activity of the generation routes, for trimming the heap once idle.
    pub idle_trim: Arc<IdleTrim>,
    /// How a request's class is named (a header, `metadata.class`) and which are configured.
    pub request_classes: Arc<RequestClasses>,
}

impl<E: ServingEngine> AppState<E> {
    /// The caps a request is checked against now: the context length is the workers' (what
    /// the worker a request lands on accepts), never above the configured one.
    pub fn limits(&self) -> Limits {
        let configured = self.limits.max_model_len;
        Limits {
            max_model_len: self
                .engine
                .max_model_len()
                .map_or(configured, |workers| workers.min(configured)),
            ..Limits::clone(&self.limits)
        }
    }
}

async fn not_found(request: Request) -> ApiError {
    ApiError::RouteNotFound {
        method: request.method().to_string(),
        path: request.uri().path().chars().take(256).collect(),
    }
}

async fn method_not_allowed(request: Request) -> axum::response::Response {
    let mut response = not_found(request).await.into_response();
    *response.status_mut() = axum::http::StatusCode::METHOD_NOT_ALLOWED;
    response
}

/// The api-server's router.
pub fn router<E: ServingEngine>(state: AppState<E>, api_key: ApiKey) -> Router {
    let generation = Router::new()
        .route(
            "/v1/completions",
            post(generation::handle::<E, completions::Completions>),
        )
        .route(
            "/v1/chat/completions",
            post(generation::handle::<E, chat::Chat>),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.idle_trim.clone(),
            track_activity,
        ));
    Router::new()
        .merge(generation)
        .route("/v1/models", get(models::handle::<E>))
        .route("/tokenize", post(tokenize::tokenize::<E>))
        .route("/detokenize", post(tokenize::detokenize::<E>))
        .route("/health", get(health::handle::<E>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            api_key,
            require_api_key,
        ))
        // Outermost: a page from a foreign origin is refused before anything else runs.
        .layer(axum::middleware::from_fn_with_state(
            state.allowed_origins.clone(),
            check_origin,
        ))
        .with_state(state)
}
