//! Link authentication, on endpoints that require a shared secret (`--link-secret-file`): right
//! after connecting, the connecting side proves it knows the secret before any of its frames
//! reach the protocol. The binding side sends the nonce, so a recorded proof cannot be replayed
//! on another connection.
//!
//! connector → `Begin`; binder → `Challenge { nonce }`; connector → `Proof { mac }` with
//! `mac = HMAC-SHA256(secret, AUTH_CONTEXT ‖ nonce)`; binder → `Accepted`, or silence and every
//! later frame of that connection dropped. A binder without a secret answers `Begin` with
//! `Accepted` at once.

use serde::{Deserialize, Serialize};

/// Domain separation for the MAC: a proof made for this use means nothing elsewhere.
pub const AUTH_CONTEXT: &[u8] = b"specula link auth v1";

/// Bytes of a challenge nonce.
pub const NONCE_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkAuth {
    Begin,
    Challenge {
        #[serde(with = "serde_bytes")]
        nonce: Vec<u8>,
    },
    Proof {
        #[serde(with = "serde_bytes")]
        mac: Vec<u8>,
    },
    Accepted,
}
