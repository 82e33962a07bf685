//! The link layer of specula's three processes, in one place so that each rule has one home:
//!
//! - [`liveness`]: a peer is alive from its hello until it misses [`liveness::MISSED_HEARTBEATS`]
//!   heartbeat intervals; a message from a peer that is unknown or declared dead makes the
//!   receiver ask for a hello (the "Paranoid Pirate" pattern of the ZeroMQ guide); a process
//!   that was itself paused forgives its peers' silence instead of declaring them dead.
//! - [`backoff`] and [`connect`]: the reconnect loop (the `zeromq` crate reconnects only SUB
//!   sockets, so every DEALER link owns one), with one backoff policy.
//! - [`peers`]: the table of peers that say hello to a ROUTER: admitted, reconnected, restarted
//!   or refused (one text for a duplicate id), the connection that acts for each, and the dead
//!   at each sweep; [`peers::hello_rule`] for a table that keeps its own state.
//! - [`router`]: the receive side of a ROUTER: one framing rule, the gate, decoding.
//! - [`identity`]: default process ids, unique per host and stable across restarts, and each
//!   process start's epoch.
//! - [`ipc`]: `ipc://` endpoint preparation (stale socket files after `kill -9`).
//! - [`auth`]: the shared-secret proof that endpoints reachable from other hosts require.
//! - [`service`]: tracing setup, SIGTERM/SIGINT, and systemd's notify socket and watchdog.
//! - [`http`]: the HTTP listener both HTTP servers run, with a header timeout, a connection
//!   cap and bounded buffers per connection.
//!
//! Each binary keeps only its own decisions (what a hello carries, what a dead peer's requests
//! become).

pub mod auth;
pub mod backoff;
pub mod connect;
mod error;
pub mod http;
pub mod identity;
pub mod ipc;
pub mod liveness;
pub mod peers;
pub mod router;
pub mod service;
pub mod write_deadline;

pub use backoff::Backoff;
pub use error::LinkError;
pub use liveness::{
    Liveness, PeerClock, Sweep, Sweeper, DEFAULT_HEARTBEAT_INTERVAL, MISSED_HEARTBEATS,
};
