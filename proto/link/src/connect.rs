//! The reconnect loop every connecting link owns (the `zeromq` crate re-establishes only SUB
//! sockets): a fresh socket per attempt, a bounded connect, the one [`Backoff`] between
//! attempts. The caller says hello on every connect it gets back.

use std::time::Duration;

use zeromq::{Socket, SocketEvent, SocketOptions};

use crate::Backoff;

/// One connect attempt; the loop retries after it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connected socket and its monitor (which reports the disconnect that ends the session).
pub struct Connected<S> {
    pub socket: S,
    pub monitor: futures::channel::mpsc::Receiver<SocketEvent>,
}

/// Connects a fresh `S` to `endpoint`, retrying with `backoff` until it succeeds. Between
/// attempts `keep_trying` runs (e.g. to keep a queue moving while the peer is down); when it
/// returns false the loop gives up with `None`. Cancel-safe: dropping the future drops the
/// socket of the attempt under way.
pub async fn connect<S: Socket>(
    endpoint: &str,
    backoff: &mut Backoff,
    mut keep_trying: impl FnMut() -> bool,
) -> Option<Connected<S>> {
    loop {
        let mut options = SocketOptions::default();
        options.connect_timeout(CONNECT_TIMEOUT);
        let mut socket = S::with_options(options);
        let monitor = socket.monitor();
        let checked = crate::ipc::check_endpoint_dir(endpoint);
        if let Err(e) = &checked {
            tracing::error!(%endpoint, error = %e, "not connecting");
        }
        let attempt = match checked {
            Ok(()) => socket.connect(endpoint).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match attempt {
            Ok(()) => {
                backoff.reset();
                tracing::info!(%endpoint, "connected");
                return Some(Connected { socket, monitor });
            }
            Err(e) => tracing::debug!(%endpoint, error = %e, "connect failed; retrying"),
        }
        if !keep_trying() {
            return None;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeromq::{PullSocket, PushSocket, SocketRecv, SocketSend, ZmqMessage};

    #[tokio::test]
    async fn connects_once_the_peer_binds_and_gives_up_when_told() {
        let dir = std::env::temp_dir().join(format!("link-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let endpoint = format!("ipc://{}/s.sock", dir.display());

        // Nobody listens: one attempt (zeromq retries inside it until CONNECT_TIMEOUT), then
        // the caller says stop.
        let mut attempts = 0;
        let gave_up = connect::<PushSocket>(&endpoint, &mut Backoff::default(), || {
            attempts += 1;
            false
        })
        .await;
        assert!(gave_up.is_none());
        assert_eq!(attempts, 1);

        let bind_endpoint = endpoint.clone();
        let server = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(120)).await;
            let mut pull = PullSocket::new();
            pull.bind(&bind_endpoint).await.unwrap();
            pull.recv().await.unwrap()
        });
        let mut connected = connect::<PushSocket>(&endpoint, &mut Backoff::default(), || true)
            .await
            .expect("connected");
        connected
            .socket
            .send(ZmqMessage::from(b"hello".to_vec()))
            .await
            .unwrap();
        let got = server.await.unwrap();
        assert_eq!(got.get(0).unwrap().as_ref(), b"hello");
        std::fs::remove_dir_all(&dir).ok();
    }
}
