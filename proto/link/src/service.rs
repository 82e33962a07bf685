//! What every specula process does as a service: logs through `tracing` (text or JSON lines on
//! stderr, `RUST_LOG` filters), stops on SIGTERM or SIGINT, and talks to systemd's notify socket
//! (ready, stopping, watchdog) when it runs under a unit with `Type=notify`.

use std::time::{Duration, Instant};

use crate::Liveness;

/// The options every process has, with one meaning and one default (flattened into each
/// binary's clap options).
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// Heartbeat period on every link; a peer silent for 3 periods is declared dead.
    #[arg(long, env = "SPECULA_HEARTBEAT_INTERVAL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=60_000))]
    pub heartbeat_interval_ms: u32,
    /// File holding the shared link secret (at least 16 bytes). With it, every ZeroMQ endpoint
    /// of the process requires peers to prove the secret before their first frame is read;
    /// without it, a tcp endpoint on a non-loopback address refuses to start.
    #[arg(long, env = "SPECULA_LINK_SECRET_FILE")]
    pub link_secret_file: Option<std::path::PathBuf>,
    /// Log format: `text`, or `json` (JSON lines on stderr).
    #[arg(long, env = "SPECULA_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl ServiceArgs {
    /// The liveness rule of this process's links.
    pub fn liveness(&self) -> Liveness {
        Liveness::new(Duration::from_millis(u64::from(self.heartbeat_interval_ms)))
    }

    /// Installs the tracing subscriber in the chosen format.
    pub fn init_tracing(&self) {
        init_tracing(self.log_format == LogFormat::Json);
    }
}

/// Installs the global `tracing` subscriber: `info` unless `RUST_LOG` says otherwise.
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the process");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

/// Tells systemd the process serves (no-op without a notify socket).
pub fn notify_ready() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
}

/// Tells systemd the process is stopping (no-op without a notify socket).
pub fn notify_stopping() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
}

/// systemd's watchdog, fed by the process's own main loop: a loop that stops turning stops the
/// pings, and systemd restarts the unit after `WatchdogSec`.
#[derive(Debug, Clone)]
pub struct Watchdog {
    /// Half of `WATCHDOG_USEC` (systemd's advice), or None when no watchdog is armed.
    period: Option<Duration>,
    last_ping: Option<Instant>,
}

impl Watchdog {
    /// Reads `WATCHDOG_USEC` / `WATCHDOG_PID` as systemd sets them for this process.
    pub fn from_env() -> Self {
        let mut usec = 0u64;
        let armed = sd_notify::watchdog_enabled(false, &mut usec) && usec > 0;
        Self::with_timeout(armed.then(|| Duration::from_micros(usec)))
    }

    /// A watchdog whose timeout is `timeout` (None: disarmed).
    pub fn with_timeout(timeout: Option<Duration>) -> Self {
        Self {
            period: timeout.map(|t| (t / 2).max(Duration::from_millis(10))),
            last_ping: None,
        }
    }

    pub fn armed(&self) -> bool {
        self.period.is_some()
    }

    /// Call on every pass of the main loop; pings when half the timeout has passed. Returns
    /// whether it pinged.
    pub fn feed(&mut self, now: Instant) -> bool {
        let Some(period) = self.period else {
            return false;
        };
        if self
            .last_ping
            .is_some_and(|t| now.saturating_duration_since(t) < period)
        {
            return false;
        }
        self.last_ping = Some(now);
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_at_half_the_timeout_and_never_when_disarmed() {
        let t0 = Instant::now();
        let mut off = Watchdog::with_timeout(None);
        assert!(!off.armed() && !off.feed(t0));
        let mut w = Watchdog::with_timeout(Some(Duration::from_secs(2)));
        assert!(w.feed(t0));
        assert!(!w.feed(t0 + Duration::from_millis(999)));
        assert!(w.feed(t0 + Duration::from_millis(1000)));
    }
}
