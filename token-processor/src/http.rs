//! `/metrics` (Prometheus text) and `/health` (200 only while ingest runs and a worker is alive).
//! `/health`'s first line says which (`ok: ...` or `unavailable: ...`); one line per live worker
//! follows, in logfmt: `worker=... model=... proposer=... num_spec_tokens=... kv_capacity_tokens=...
//! kv_bytes=... draft_kv_bytes=... kv_blocks_used=... kv_blocks_cached=... kv_blocks_free=...`.

use std::sync::Arc;

use crate::ingest::{IngestHealth, WorkerView};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

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
    let workers: String = state.health.workers().iter().map(worker_line).collect();
    match state.health.check() {
        Ok(n) => (
            StatusCode::OK,
            format!("ok: {n} worker(s) alive\n{workers}"),
        ),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unavailable: {reason}\n{workers}"),
        ),
    }
}

/// One live worker as `/health` shows it: what it drafts with, its KV cache (tokens it holds,
/// bytes it may take, blocks in use, cached for later prompts and free, at its latest
/// heartbeat) and what drafting costs beside it.
fn worker_line(view: &WorkerView) -> String {
    let WorkerView { hello, kv_blocks } = view;
    format!(
        "worker={} model={} proposer={} num_spec_tokens={} kv_capacity_tokens={} kv_bytes={} \
         draft_kv_bytes={} kv_blocks_used={} kv_blocks_cached={} kv_blocks_free={}\n",
        logfmt(&hello.worker_id),
        logfmt(&hello.model),
        logfmt(&hello.proposer),
        hello.num_spec_tokens,
        hello.kv_capacity_tokens,
        hello.kv_bytes,
        hello.draft_kv_bytes,
        kv_blocks.used,
        kv_blocks.cached,
        kv_blocks.free
    )
}

/// A logfmt value: as is when it is one plain word, else quoted and escaped (ids and model names
/// are the workers' own words).
fn logfmt(value: &str) -> String {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=' || c == '\\');
    if plain {
        value.to_owned()
    } else {
        format!("{value:?}")
    }
}

#[cfg(test)]
mod tests {
    use proto::worker_tp::{KvBlocks, WorkerHello};

    use super::*;

    #[test]
    fn worker_lines_are_logfmt_with_odd_values_quoted() {
        let hello = WorkerHello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: "engine-worker@host/ipc:///run/specula/api".into(),
            epoch: 1,
            model: "my model".into(),
            num_spec_tokens: 4,
            proposer: "draft:SmolLM2-135M-Instruct.Q4_0".into(),
            ready: true,
            heartbeat_interval_ms: 500,
            max_model_len: 2048,
            kv_capacity_tokens: 32_768,
            kv_bytes: 0,
            draft_kv_bytes: 6_291_456,
            max_num_seqs: 16,
            session: 7,
        };
        let kv_blocks = KvBlocks {
            used: 3,
            cached: 5,
            free: 2040,
        };
        assert_eq!(
            worker_line(&WorkerView { hello, kv_blocks }),
            "worker=engine-worker@host/ipc:///run/specula/api model=\"my model\" \
             proposer=draft:SmolLM2-135M-Instruct.Q4_0 num_spec_tokens=4 kv_capacity_tokens=32768 \
             kv_bytes=0 draft_kv_bytes=6291456 kv_blocks_used=3 kv_blocks_cached=5 \
             kv_blocks_free=2040\n"
        );
        assert_eq!(logfmt(""), "\"\"");
        assert_eq!(logfmt("a\"b=c"), "\"a\\\"b=c\"");
    }
}
