//! The receive side of every ROUTER that takes connections (the worker's api-server socket,
//! the token-processor's ingest and forward sockets), under one rule: a message is a routing id
//! and exactly one payload frame (our DEALERs send nothing else), the payload passes the
//! link-secret gate ([`crate::auth::Gate`]) before anything reads it, then it is decoded. What
//! a process does with each outcome (answer, count, log) stays with it.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use zeromq::ZmqMessage;

use crate::auth::{Gate, Verdict};

/// One received message after the framing rule, the gate and decoding.
#[derive(Debug)]
pub enum Received<M> {
    /// A message of the protocol from the connection `routing_id`.
    Message { routing_id: Bytes, msg: M },
    /// A step of the link-secret exchange: send `reply` back to `routing_id`, nothing else.
    Auth { routing_id: Bytes, reply: Vec<u8> },
    /// Not a routing id and one payload frame: dropped unread.
    BadFraming { parts: usize },
    /// From a connection that has not proved the secret: dropped (the gate counts it).
    Gated,
    /// Admitted, but not a message of the protocol.
    Malformed {
        routing_id: Bytes,
        bytes: usize,
        error: proto::ProtoError,
    },
}

/// Applies the rule to one message from a ROUTER socket.
pub fn receive<M: DeserializeOwned>(gate: &mut Gate, msg: ZmqMessage) -> Received<M> {
    let mut frames = msg.into_vec();
    let parts = frames.len();
    let (Some(payload), Some(routing_id), 2) = (frames.pop(), frames.pop(), parts) else {
        return Received::BadFraming { parts };
    };
    match gate.check(&routing_id, &payload) {
        Verdict::Pass => {}
        Verdict::Reply(reply) => return Received::Auth { routing_id, reply },
        Verdict::Drop => return Received::Gated,
    }
    match proto::decode::<M>(&payload) {
        Ok(msg) => Received::Message { routing_id, msg },
        Err(error) => Received::Malformed {
            routing_id,
            bytes: payload.len(),
            error,
        },
    }
}

#[cfg(test)]
mod tests {
    use proto::api_worker::ApiToWorker;

    use super::*;

    fn message(frames: &[&[u8]]) -> ZmqMessage {
        let mut frames = frames.iter().map(|f| Bytes::copy_from_slice(f));
        let mut msg = ZmqMessage::from(frames.next().unwrap_or_default());
        frames.for_each(|f| msg.push_back(f));
        msg
    }

    fn abort_frame() -> Vec<u8> {
        proto::encode(&ApiToWorker::Abort(proto::api_worker::Abort { id: 9 })).unwrap()
    }

    #[test]
    fn a_routing_id_and_one_payload_is_decoded() {
        let mut gate = Gate::new(None);
        let got = receive::<ApiToWorker>(&mut gate, message(&[b"conn", &abort_frame()]));
        match got {
            Received::Message { routing_id, msg } => {
                assert_eq!(&routing_id[..], b"conn");
                assert!(matches!(msg, ApiToWorker::Abort(a) if a.id == 9));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn any_other_framing_is_dropped_unread() {
        let mut gate = Gate::new(None);
        let frame = abort_frame();
        for frames in [
            vec![&b"conn"[..]],
            vec![&b"conn"[..], &frame, &frame],
            vec![&b"conn"[..], &b""[..], &frame],
        ] {
            let parts = frames.len();
            let got = receive::<ApiToWorker>(&mut gate, message(&frames));
            assert!(
                matches!(got, Received::BadFraming { parts: p } if p == parts),
                "{parts} parts: {got:?}"
            );
        }
    }

    #[test]
    fn an_admitted_frame_that_is_not_the_protocol_is_malformed() {
        let mut gate = Gate::new(None);
        let got = receive::<ApiToWorker>(&mut gate, message(&[b"conn", b"\xc1junk"]));
        assert!(
            matches!(got, Received::Malformed { bytes: 5, .. }),
            "{got:?}"
        );
    }

    #[test]
    fn with_a_secret_nothing_is_decoded_before_the_exchange() {
        let secret = crate::auth::Secret::from_bytes(b"0123456789abcdef0123456789abcdef");
        let mut gate = Gate::new(Some(secret));
        let got = receive::<ApiToWorker>(&mut gate, message(&[b"conn", &abort_frame()]));
        assert!(matches!(got, Received::Gated), "{got:?}");
        assert_eq!(gate.dropped(), 1);
    }
}
