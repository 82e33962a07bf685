//! systemd integration (only when `NOTIFY_SOCKET` is set): `READY=1` once the server is first
//! healthy, and `WATCHDOG=1` only while the engine client's liveness loop keeps running, so a
//! wedged runtime gets restarted.

use std::time::Duration;

use crate::engine::EngineClient;

/// Runs until the process exits.
pub async fn run(engine: EngineClient) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut watchdog_usec = 0u64;
    let watchdog = sd_notify::watchdog_enabled(false, &mut watchdog_usec);
    let period = if watchdog {
        Duration::from_micros(watchdog_usec / 2).max(Duration::from_millis(100))
    } else {
        Duration::from_millis(250)
    };
    let mut ready_sent = false;
    let mut last_ticks = engine.watchdog_ticks();
    let mut tick = tokio::time::interval(period.min(Duration::from_millis(250)));
    let mut since_ping = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        if !ready_sent && engine.readiness().is_ok() {
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
            tracing::info!("notified systemd: ready");
            ready_sent = true;
        }
        if watchdog && since_ping.elapsed() >= period {
            let ticks = engine.watchdog_ticks();
            if ticks != last_ticks {
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                last_ticks = ticks;
                since_ping = tokio::time::Instant::now();
            }
        }
    }
}
