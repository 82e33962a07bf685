//! Who a request is for fair admission: its API key where it sends one, else its peer's
//! address (without the port: one machine is one client). Read from the request's parts; the
//! key is hashed with a per-process random key, so neither keys nor addresses are kept. Also
//! its connection's socket ([`ClientSocket`]), by which a stream judges whether it is read.

use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use crate::engine::admission::ClientKey;

fn hashed(kind: &str, value: &[u8]) -> ClientKey {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    let hash = STATE.get_or_init(RandomState::new).hash_one(value);
    ClientKey::new(format!("{kind}:{hash:016x}"))
}

/// The client of a request with these parts.
pub fn client_of(parts: &Parts) -> ClientKey {
    let bearer = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(key) = bearer {
        return hashed("key", key.as_bytes());
    }
    match parts.extensions.get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(addr)) => hashed("addr", addr.ip().to_string().as_bytes()),
        None => ClientKey::unknown(),
    }
}

/// The socket of the request's connection, where the server put one (not in in-process tests).
#[derive(Debug, Clone, Copy)]
pub struct ClientSocket(pub Option<link::http::ConnectionSocket>);

impl<S: Send + Sync> FromRequestParts<S> for ClientSocket {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(parts.extensions.get().copied()))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(client_of(parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(auth: Option<&str>, addr: Option<&str>) -> Parts {
        let mut request = axum::http::Request::builder();
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        if let Some(addr) = addr {
            parts
                .extensions
                .insert(ConnectInfo(addr.parse::<SocketAddr>().unwrap()));
        }
        parts
    }

    #[test]
    fn a_key_names_the_client_else_the_address_without_its_port() {
        let a1 = client_of(&parts(None, Some("10.0.0.1:5000")));
        let a2 = client_of(&parts(None, Some("10.0.0.1:6000")));
        let b = client_of(&parts(None, Some("10.0.0.2:5000")));
        assert_eq!(a1, a2);
        assert_ne!(a1, b);
        let k1 = client_of(&parts(Some("Bearer sk-1"), Some("10.0.0.1:5000")));
        let k1_elsewhere = client_of(&parts(Some("Bearer sk-1"), Some("10.0.0.2:1")));
        let k2 = client_of(&parts(Some("Bearer sk-2"), Some("10.0.0.1:5000")));
        assert_eq!(k1, k1_elsewhere);
        assert_ne!(k1, k2);
        assert_ne!(k1, a1);
        assert_eq!(client_of(&parts(None, None)), ClientKey::unknown());
    }
}
