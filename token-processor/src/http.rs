//! `/metrics` (Prometheus text) and `/health` (200 only while ingest runs and a worker is alive).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::ingest::IngestHealth;

#[derive(Clone)]
struct AppState {
    prometheus: PrometheusHandle,
    health: Arc<IngestHealth>,
}

pub fn router(prometheus: PrometheusHandle, health: Arc<IngestHealth>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health_check))
        .with_state(AppState { prometheus, health })
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut text = state.prometheus.render();
    crate::binned::render(&mut text);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

async fn health_check(State(state): State<AppState>) -> impl IntoResponse {
    match state.health.check() {
        Ok(workers) => (StatusCode::OK, format!("ok: {workers} worker(s) alive\n")),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unavailable: {reason}\n"),
        ),
    }
}
