//! systemd's `READY=1` (only when `NOTIFY_SOCKET` is set), once the server is first healthy.
//! The watchdog is fed by the engine client's liveness loop, the api-server's main loop.

use std::time::Duration;

use crate::engine::{EngineClient, ServingEngine};

/// Runs until the server is first ready.
pub async fn run(engine: EngineClient) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        if engine.readiness().is_ok() {
            link::service::notify_ready();
            tracing::info!("notified systemd: ready");
            return;
        }
    }
}
