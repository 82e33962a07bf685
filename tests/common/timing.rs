//! The timing every test stack runs with, and the bounds the tests derive from it. A bound is a
//! configured setting (heartbeat, liveness window, outage window, drain deadline) plus one
//! stated slack for a loaded machine, never a bare number of seconds: change a setting and every
//! bound that depends on it follows.

use std::time::Duration;

use link::Liveness;

/// How long a debug binary may go unscheduled while the test and its siblings load both cores
/// of a 2-core machine, plus the test client's own polling: the one margin every bound adds.
/// (Measured: a 2 s detection rule is seen in 1.8-2.5 s; the slack is more than the spread.)
pub const LOADED_MACHINE_SLACK: Duration = Duration::from_secs(3);

/// How long a test waits for a condition that a working build meets within seconds (a stack
/// starting, streams under way, generation on a debug build): the cap turns a hang into a
/// failure and bounds nothing the product claims.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How soon a request must succeed once a paused process runs again or the stack is healthy
/// after a fault: the product's requirement, not a setting (a paused process forgives its peers,
/// and they ask it for a hello at once, whatever the window).
pub const RECOVERY: Duration = Duration::from_secs(3);

/// From sending a request to its status, on a default stack under a burst: the api-server's
/// longest designed wait (its admission wait, then a 429 for a request that finds no room; its
/// patience for a stream's first token, then a 200 for a stream without one yet), plus the
/// slack. The product's target for the time to a status (2 s) is a speed target: it is
/// measured on release builds (`docs/history/benchmarks-notebook.md`, "The front door under a burst").
pub fn status_bound() -> Duration {
    api_server::engine::DEFAULT_ADMISSION_WAIT.max(api_server::stream::FIRST_UPDATE_PATIENCE)
        + LOADED_MACHINE_SLACK
}

/// The liveness rule every process of a test stack runs with (each is started with this
/// `--heartbeat-interval-ms`): the product's default.
pub fn liveness() -> Liveness {
    Liveness::new(link::DEFAULT_HEARTBEAT_INTERVAL)
}

/// The `--heartbeat-interval-ms` argument of every stack process.
pub fn heartbeat_arg() -> String {
    liveness().interval_ms().to_string()
}

/// From a peer's death (or a link that stops acknowledging) to a process acting on it and
/// telling its other peers with its next heartbeat: the liveness window, one heartbeat, slack.
pub fn detection_bound() -> Duration {
    let rule = liveness();
    rule.window() + rule.interval + LOADED_MACHINE_SLACK
}

/// A pause (SIGSTOP) that every peer of the paused process takes for a death: two windows.
pub fn pause_past_the_window() -> Duration {
    liveness().window() * 2
}

/// Requests that wait out a token-processor outage of `window` end within this of its death:
/// the death is detected, then the window runs.
pub fn outage_bound(window: Duration) -> Duration {
    detection_bound() + window
}

/// A process sent SIGKILL is reaped within this.
pub fn exit_after_kill() -> Duration {
    LOADED_MACHINE_SLACK
}

/// A process sent SIGTERM exits within this of a drain `deadline`.
pub fn exit_after_drain(deadline: Duration) -> Duration {
    deadline + LOADED_MACHINE_SLACK
}

/// Every stack's api-server `--tp-outage-window-secs` (the product's default) unless a test
/// passes its own.
pub const TP_OUTAGE_WINDOW: Duration = Duration::from_secs(30);

/// Every stack's engine-worker `--drain-timeout-secs` and api-server `--shutdown-grace-secs`
/// (the product's defaults) unless a test passes its own.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Every stack's token-processor `--shutdown-timeout-ms` (the product's default).
pub const TP_FLUSH_DEADLINE: Duration = Duration::from_secs(5);
