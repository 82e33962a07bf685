//! `GET /health`: 200 only when requests can be served (tokenizer loaded, which holds once the
//! server runs; a live accepting engine-worker; a token-processor heard within its window).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::AppState;
use crate::error::ApiError;

pub async fn handle(State(state): State<AppState>) -> Response {
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
        Err(reason) => ApiError::unavailable(format!("not ready: {reason}")).into_response(),
    }
}
