//! Shared-secret authentication of links (`proto::auth` has the exchange). Endpoints that anyone
//! on the network could reach (tcp on a non-loopback address) require a secret, read from the
//! file `--link-secret-file` names; with a secret every endpoint of the process requires it.
//!
//! The binding side runs each incoming frame through its [`Gate`] before the protocol sees it;
//! the connecting side calls [`prove`] right after each connect, before its hello.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use proto::auth::{LinkAuth, AUTH_CONTEXT, NONCE_BYTES};
use sha2::Sha256;
use zeromq::{SocketRecv, SocketSend, ZmqMessage};

use crate::LinkError;

/// Shortest secret accepted: 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;

/// Admitted connections a gate remembers; past it the one silent longest is forgotten (a live
/// peer heartbeats, so only dead connections are; a forgotten one proves itself again when it
/// reconnects). Never made room for by an unproven connection.
pub const ADMITTED_MEMORY: usize = 4096;

/// Connections challenged and not yet proven that a gate remembers at once; past it the oldest
/// challenge is forgotten. Unproven connections take nothing from admitted ones.
pub const UNPROVEN_MEMORY: usize = 1024;

/// How long a challenge stays open: a connector answers within [`PROVE_TIMEOUT`].
pub const UNPROVEN_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest frame of the exchange (a proof is about 45 bytes).
const MAX_AUTH_FRAME: usize = 128;

/// How long [`prove`] waits for each answer.
pub const PROVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Dropped frames are logged at most this often (with the count so far): a stranger's flood
/// must not flood the log, and an operator still sees that strangers knock.
pub const DROP_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The log line for frames dropped from connections that have not proved the secret.
pub const DROPPED_FRAME_LOG: &str =
    "dropped a frame from a connection that has not proved the link secret";

/// The link secret: never printed.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// Reads the secret from `path` (one trailing newline is not part of it).
    pub fn load(path: &Path) -> Result<Self, LinkError> {
        let err = |reason: String| LinkError::Secret {
            path: path.to_owned(),
            reason,
        };
        let mut bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        }
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(err(format!(
                "{} bytes; at least {MIN_SECRET_BYTES} are required",
                bytes.len()
            )));
        }
        Ok(Self(bytes.into()))
    }

    #[cfg(test)]
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        Self(bytes.into())
    }

    fn mac(&self) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(AUTH_CONTEXT);
        mac
    }

    /// The proof for `nonce`.
    fn prove(&self, nonce: &[u8]) -> Vec<u8> {
        let mut mac = self.mac();
        mac.update(nonce);
        mac.finalize().into_bytes().to_vec()
    }

    /// Whether `proof` answers `nonce` (constant time).
    fn verify(&self, nonce: &[u8], proof: &[u8]) -> bool {
        let mut mac = self.mac();
        mac.update(nonce);
        mac.verify_slice(proof).is_ok()
    }
}

/// The secret of a process from its `--link-secret-file`, checked against its endpoints: one that
/// is tcp on an address other than loopback refuses to run without a secret.
pub fn secret_for(file: Option<&PathBuf>, endpoints: &[&str]) -> Result<Option<Secret>, LinkError> {
    let secret = file.map(|path| Secret::load(path)).transpose()?;
    if secret.is_none() {
        if let Some(open) = endpoints.iter().find(|e| reachable_from_outside(e)) {
            return Err(LinkError::SecretRequired {
                endpoint: (*open).to_owned(),
            });
        }
    }
    Ok(secret)
}

/// A tcp endpoint whose host is not a loopback address (a name counts as reachable).
pub fn reachable_from_outside(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return false;
    };
    let host = rest.rsplit_once(':').map_or(rest, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => host != "localhost",
    }
}

/// What to do with a frame from a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An admitted connection (or no secret): hand the frame to the protocol.
    Pass,
    /// Part of the exchange: send this frame back, hand nothing on.
    Reply(Vec<u8>),
    /// From a connection that has not proved the secret: drop it.
    Drop,
}

/// The binding side's filter: which connections (routing ids) proved the secret. Admitted and
/// unproven connections are kept apart, each bounded on its own, so no number of strangers
/// that only say `Begin` can push out a peer that proved itself.
#[derive(Debug)]
pub struct Gate {
    secret: Option<Secret>,
    /// Routing id → when it was last heard.
    admitted: HashMap<Bytes, Instant>,
    /// Routing id → the nonce sent to it and when.
    challenged: HashMap<Bytes, (Vec<u8>, Instant)>,
    /// Challenged ids, oldest first (an id already proven or dropped is skipped).
    challenge_order: VecDeque<Bytes>,
    /// Frames dropped since start, and when that was last logged.
    dropped: u64,
    drop_logged: Option<Instant>,
}

impl Gate {
    pub fn new(secret: Option<Secret>) -> Self {
        Self {
            secret,
            admitted: HashMap::new(),
            challenged: HashMap::new(),
            challenge_order: VecDeque::new(),
            dropped: 0,
            drop_logged: None,
        }
    }

    /// Judges one frame from `routing_id`.
    pub fn check(&mut self, routing_id: &Bytes, frame: &[u8]) -> Verdict {
        self.check_at(routing_id, frame, Instant::now())
    }

    /// [`Gate::check`] at `now`.
    pub fn check_at(&mut self, routing_id: &Bytes, frame: &[u8], now: Instant) -> Verdict {
        // The exchange's frames are a few dozen bytes; protocol frames are not even tried.
        let auth = |frame: &[u8]| {
            (frame.len() <= MAX_AUTH_FRAME)
                .then(|| proto::decode::<LinkAuth>(frame).ok())
                .flatten()
        };
        let Some(secret) = &self.secret else {
            // Open gate: only a connector with a secret asks, and it may go on at once.
            return match auth(frame) {
                Some(LinkAuth::Begin) => Verdict::Reply(encode(&LinkAuth::Accepted)),
                _ => Verdict::Pass,
            };
        };
        if let Some(heard) = self.admitted.get_mut(routing_id) {
            *heard = now;
            return Verdict::Pass;
        }
        match auth(frame) {
            Some(LinkAuth::Begin) => {
                let nonce: Vec<u8> = (0..NONCE_BYTES).map(|_| rand::random::<u8>()).collect();
                self.challenge(routing_id, nonce.clone(), now);
                Verdict::Reply(encode(&LinkAuth::Challenge { nonce }))
            }
            Some(LinkAuth::Proof { mac }) => match self.challenged.remove(routing_id) {
                Some((nonce, sent))
                    if now.duration_since(sent) <= UNPROVEN_TIMEOUT
                        && secret.verify(&nonce, &mac) =>
                {
                    self.admit(routing_id, now);
                    Verdict::Reply(encode(&LinkAuth::Accepted))
                }
                _ => {
                    tracing::warn!("a connection failed to prove the link secret; dropping it");
                    self.drop_frame(now)
                }
            },
            _ => self.drop_frame(now),
        }
    }

    /// Counts a dropped frame and says so: the first at once, then at most once per
    /// [`DROP_LOG_INTERVAL`].
    fn drop_frame(&mut self, now: Instant) -> Verdict {
        self.dropped += 1;
        let due = self
            .drop_logged
            .is_none_or(|at| now.saturating_duration_since(at) >= DROP_LOG_INTERVAL);
        if due {
            self.drop_logged = Some(now);
            tracing::warn!(dropped_total = self.dropped, "{DROPPED_FRAME_LOG}");
        }
        Verdict::Drop
    }

    /// Frames dropped since start.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn challenge(&mut self, routing_id: &Bytes, nonce: Vec<u8>, now: Instant) {
        // Forget challenges that timed out, and the oldest past the bound.
        while let Some(oldest) = self.challenge_order.front() {
            let expired = self
                .challenged
                .get(oldest)
                .is_none_or(|(_, sent)| now.duration_since(*sent) > UNPROVEN_TIMEOUT);
            if !expired && self.challenged.len() < UNPROVEN_MEMORY {
                break;
            }
            if let Some(oldest) = self.challenge_order.pop_front() {
                self.challenged.remove(&oldest);
            }
        }
        if self
            .challenged
            .insert(routing_id.clone(), (nonce, now))
            .is_none()
        {
            self.challenge_order.push_back(routing_id.clone());
        }
    }

    fn admit(&mut self, routing_id: &Bytes, now: Instant) {
        if self.admitted.len() >= ADMITTED_MEMORY {
            let silent_longest = self
                .admitted
                .iter()
                .min_by_key(|(_, heard)| **heard)
                .map(|(id, _)| id.clone());
            if let Some(id) = silent_longest {
                self.admitted.remove(&id);
            }
        }
        self.admitted.insert(routing_id.clone(), now);
    }

    /// Connections admitted, and challenged but not yet proven.
    pub fn remembered(&self) -> (usize, usize) {
        (self.admitted.len(), self.challenged.len())
    }
}

fn encode(msg: &LinkAuth) -> Vec<u8> {
    proto::encode(msg).expect("auth messages always encode")
}

/// The connecting side: proves the secret on a fresh connection, before anything else is sent.
/// Frames other than the exchange's that arrive meanwhile are dropped (nothing else is due).
pub async fn prove<S: SocketSend + SocketRecv>(
    socket: &mut S,
    secret: &Secret,
) -> Result<(), LinkError> {
    send(socket, &LinkAuth::Begin).await?;
    let nonce = match next_auth(socket).await? {
        LinkAuth::Challenge { nonce } => nonce,
        LinkAuth::Accepted => return Ok(()), // the peer requires no secret
        _ => return Err(auth_failed("unexpected answer to Begin")),
    };
    send(
        socket,
        &LinkAuth::Proof {
            mac: secret.prove(&nonce),
        },
    )
    .await?;
    match next_auth(socket).await? {
        LinkAuth::Accepted => Ok(()),
        _ => Err(auth_failed("unexpected answer to the proof")),
    }
}

fn auth_failed(reason: impl std::fmt::Display) -> LinkError {
    LinkError::AuthFailed {
        reason: reason.to_string(),
    }
}

async fn send<S: SocketSend>(socket: &mut S, msg: &LinkAuth) -> Result<(), LinkError> {
    tokio::time::timeout(PROVE_TIMEOUT, socket.send(ZmqMessage::from(encode(msg))))
        .await
        .map_err(|_| auth_failed("send timed out"))?
        .map_err(auth_failed)
}

async fn next_auth<S: SocketRecv>(socket: &mut S) -> Result<LinkAuth, LinkError> {
    let deadline = tokio::time::Instant::now() + PROVE_TIMEOUT;
    loop {
        let msg = tokio::time::timeout_at(deadline, socket.recv())
            .await
            .map_err(|_| auth_failed("no answer (a wrong secret, or none the peer knows)"))?
            .map_err(auth_failed)?;
        if let Some(auth) = msg.iter().find_map(|f| proto::decode::<LinkAuth>(f).ok()) {
            return Ok(auth);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    fn challenge(gate: &mut Gate, who: &Bytes) -> Vec<u8> {
        let Verdict::Reply(frame) = gate.check(who, &encode(&LinkAuth::Begin)) else {
            panic!("Begin gets a challenge");
        };
        let Ok(LinkAuth::Challenge { nonce }) = proto::decode(&frame) else {
            panic!("a challenge");
        };
        assert_eq!(nonce.len(), NONCE_BYTES);
        nonce
    }

    #[test]
    fn only_a_connection_that_proved_the_secret_passes() {
        let secret = Secret::from_bytes(b"0123456789abcdef-shared");
        let mut gate = Gate::new(Some(secret.clone()));
        let hello = b"\x92\x01\x02".to_vec(); // any protocol frame
        let (a, b) = (id(1), id(2));
        assert_eq!(gate.check(&a, &hello), Verdict::Drop, "before any proof");
        let nonce = challenge(&mut gate, &a);
        assert_eq!(
            gate.check(&a, &hello),
            Verdict::Drop,
            "challenged, not proved"
        );
        let proof = encode(&LinkAuth::Proof {
            mac: secret.prove(&nonce),
        });
        // Another connection cannot use a's proof.
        challenge(&mut gate, &b);
        assert_eq!(gate.check(&b, &proof), Verdict::Drop);
        assert_eq!(gate.check(&b, &hello), Verdict::Drop);
        assert_eq!(
            gate.check(&a, &proof),
            Verdict::Reply(encode(&LinkAuth::Accepted))
        );
        assert_eq!(gate.check(&a, &hello), Verdict::Pass);
        // A wrong secret fails.
        let c = id(3);
        let nonce = challenge(&mut gate, &c);
        let wrong = Secret::from_bytes(b"not-the-shared-secret").prove(&nonce);
        assert_eq!(
            gate.check(&c, &encode(&LinkAuth::Proof { mac: wrong })),
            Verdict::Drop
        );
        assert_eq!(gate.check(&c, &hello), Verdict::Drop);
        // Every drop counted: a's hello twice, b's proof and hello, c's proof and hello.
        assert_eq!(gate.dropped(), 6);
    }

    #[test]
    fn an_open_gate_passes_everything_and_accepts_a_begin() {
        let mut gate = Gate::new(None);
        assert_eq!(gate.check(&id(1), b"\x92\x01\x02"), Verdict::Pass);
        assert_eq!(
            gate.check(&id(1), &encode(&LinkAuth::Begin)),
            Verdict::Reply(encode(&LinkAuth::Accepted))
        );
    }

    fn admitted(gate: &mut Gate, secret: &Secret, who: &Bytes, now: Instant) {
        let Verdict::Reply(frame) = gate.check_at(who, &encode(&LinkAuth::Begin), now) else {
            panic!("Begin gets a challenge");
        };
        let Ok(LinkAuth::Challenge { nonce }) = proto::decode(&frame) else {
            panic!("a challenge");
        };
        let proof = encode(&LinkAuth::Proof {
            mac: secret.prove(&nonce),
        });
        assert_eq!(
            gate.check_at(who, &proof, now),
            Verdict::Reply(encode(&LinkAuth::Accepted))
        );
    }

    /// 5,000 strangers that only say `Begin` never push out an admitted peer, and the gate's
    /// memory stays bounded.
    #[test]
    fn unproven_connections_never_evict_an_admitted_peer() {
        let secret = Secret::from_bytes(b"0123456789abcdef");
        let mut gate = Gate::new(Some(secret.clone()));
        let now = Instant::now();
        let live = id(0);
        admitted(&mut gate, &secret, &live, now);
        let hello = b"\x92\x01\x02".to_vec();
        for n in 1..=5000u32 {
            let at = now + Duration::from_millis(u64::from(n));
            gate.check_at(
                &Bytes::from(n.to_le_bytes().to_vec()),
                &encode(&LinkAuth::Begin),
                at,
            );
            if n % 100 == 0 {
                // The live peer keeps talking meanwhile.
                assert_eq!(gate.check_at(&live, &hello, at), Verdict::Pass);
            }
        }
        assert_eq!(gate.check(&live, &hello), Verdict::Pass);
        let (admitted_now, unproven) = gate.remembered();
        assert_eq!(admitted_now, 1);
        assert!(unproven <= UNPROVEN_MEMORY, "{unproven}");
        assert!(gate.challenge_order.len() <= UNPROVEN_MEMORY + 1);
    }

    /// Past the admitted bound (reconnects over a long life), the connection silent longest is
    /// forgotten, never one that is heard from.
    #[test]
    fn a_full_gate_forgets_the_admitted_peer_silent_longest() {
        let secret = Secret::from_bytes(b"0123456789abcdef");
        let mut gate = Gate::new(Some(secret.clone()));
        let start = Instant::now();
        let live = id(0);
        admitted(&mut gate, &secret, &live, start);
        let hello = b"\x92\x01\x02".to_vec();
        for n in 1..=(ADMITTED_MEMORY as u32 + 10) {
            let at = start + Duration::from_millis(u64::from(n));
            admitted(
                &mut gate,
                &secret,
                &Bytes::from(n.to_le_bytes().to_vec()),
                at,
            );
            assert_eq!(gate.check_at(&live, &hello, at), Verdict::Pass, "at {n}");
        }
        assert_eq!(gate.remembered().0, ADMITTED_MEMORY);
        // The first reconnects (dead since) were forgotten.
        assert_eq!(
            gate.check(&Bytes::from(1u32.to_le_bytes().to_vec()), &hello),
            Verdict::Drop
        );
    }

    /// A proof after the challenge timed out is refused.
    #[test]
    fn a_late_proof_is_refused() {
        let secret = Secret::from_bytes(b"0123456789abcdef");
        let mut gate = Gate::new(Some(secret.clone()));
        let now = Instant::now();
        let who = id(1);
        let Verdict::Reply(frame) = gate.check_at(&who, &encode(&LinkAuth::Begin), now) else {
            panic!("Begin gets a challenge");
        };
        let Ok(LinkAuth::Challenge { nonce }) = proto::decode(&frame) else {
            panic!("a challenge");
        };
        let proof = encode(&LinkAuth::Proof {
            mac: secret.prove(&nonce),
        });
        let late = now + UNPROVEN_TIMEOUT + Duration::from_secs(1);
        assert_eq!(gate.check_at(&who, &proof, late), Verdict::Drop);
    }

    #[test]
    fn endpoints_reachable_from_outside_need_a_secret() {
        assert!(!reachable_from_outside("ipc:///run/specula/a.sock"));
        assert!(!reachable_from_outside("tcp://127.0.0.1:5555"));
        assert!(!reachable_from_outside("tcp://[::1]:5555"));
        assert!(!reachable_from_outside("tcp://localhost:5555"));
        assert!(reachable_from_outside("tcp://0.0.0.0:5555"));
        assert!(reachable_from_outside("tcp://10.1.2.3:5555"));
        assert!(reachable_from_outside("tcp://worker-1.internal:5555"));
        let err = secret_for(None, &["ipc:///x", "tcp://0.0.0.0:1"]).unwrap_err();
        assert!(err.to_string().contains("tcp://0.0.0.0:1"), "{err}");
        assert!(secret_for(None, &["tcp://127.0.0.1:1"]).unwrap().is_none());
    }

    #[test]
    fn a_short_or_missing_secret_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("link-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short");
        std::fs::write(&short, b"tooshort\n").unwrap();
        assert!(Secret::load(&short).is_err());
        assert!(Secret::load(&dir.join("missing")).is_err());
        let good = dir.join("good");
        std::fs::write(&good, b"0123456789abcdef\n").unwrap();
        assert!(Secret::load(&good).is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }
}
