//! `GET /health`: 200 only when requests can be served (tokenizer loaded, which holds once the
//! server runs; a live accepting engine-worker; a token-processor heard within its window).
//! A 503 carries the OpenAI error envelope with the reason, and the same engine status under
//! `engine` (what is waiting, what the workers keep), so an operator sees both.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::AppState;
use crate::engine::ServingEngine;
use crate::error::ApiError;

pub async fn handle<E: ServingEngine>(State(state): State<AppState<E>>) -> Response {
    match state.engine.readiness() {
        Ok(()) => {
            let mut body = state.engine.status();
            body["idle_heap_trimmed"] = state
                .idle_trim
                .trimmed_since_last_request(state.engine.in_flight())
                .into();
            body["status"] = "ok".into();
            Json(body).into_response()
        }
        Err(reason) => {
            let error = ApiError::unavailable(format!("not ready: {reason}"));
            let mut body: serde_json::Value =
                serde_json::from_str(&error.envelope_json()).unwrap_or_default();
            body["engine"] = state.engine.status();
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}
