//! specula's wire types: every message that crosses a process boundary, and nothing else.
//!
//! Three links, each a module:
//! - [`api_worker`]: api-server ⇄ engine-worker (requests, aborts, worker hello/heartbeats),
//! - [`worker_tp`]: engine-worker → token-processor (hello, step batches, heartbeats, resync),
//! - [`tp_api`]: token-processor ⇄ api-server (per-request outputs).
//!
//! and [`auth`], the proof of a shared secret that precedes them on endpoints that require one.
//! One file format rides along, since a process writes it and another reads it: [`trace`], the
//! acceptance trace (JSON Lines; no part of the protocol or its version).
//!
//! Frames are MessagePack (rmp-serde, structs as arrays) behind [`codec`], which caps every
//! frame's size and turns every malformed input into a [`ProtoError`]. Every hello carries
//! [`PROTOCOL_VERSION`]; [`check_version`] rejects a peer that speaks another one.

pub mod api_worker;
pub mod auth;
pub mod classes;
pub mod codec;
pub mod columns;
mod error;
pub mod metrics;
pub mod tp_api;
pub mod trace;
pub mod types;
pub mod worker_tp;

pub use codec::{decode, encode, MAX_FRAME_BYTES};
pub use error::ProtoError;
pub use metrics::SpeculateMetrics;
pub use types::{FinishReason, RequestId, TokenLogprob, MAX_TOP_LOGPROBS};

/// Version of the wire protocol; bump on any change to a message's encoding.
pub const PROTOCOL_VERSION: u32 = 12;

/// Fails with [`ProtoError::VersionMismatch`] unless the peer speaks [`PROTOCOL_VERSION`].
pub fn check_version(peer: &str, peer_version: u32) -> Result<(), ProtoError> {
    if peer_version == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(ProtoError::VersionMismatch {
            peer: peer.to_owned(),
            peer_version,
            ours: PROTOCOL_VERSION,
        })
    }
}
