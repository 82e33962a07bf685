//! The HTTP server: hyper's HTTP/1.1 connection builder under the axum router, with the limits
//! `axum::serve` does not offer. A client must send a request's headers within
//! `header_read_timeout` (also the idle limit of a kept-alive connection), so a slow or silent
//! client cannot hold a connection forever; at most `max_connections` are open at once (beyond
//! it, new connections wait in the kernel's backlog); on shutdown no connection is accepted and
//! open ones finish their requests.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;

/// The HTTP listener on `addr`, with room for `backlog` connections the kernel has completed but
/// the server not yet accepted (Linux caps it at `net.core.somaxconn`). Tokio's own `bind` asks
/// for 128: past that many connections arriving at once the kernel drops the handshakes' last
/// step, and those clients wait a retransmission (1 s) before they are even accepted; a burst
/// of 1,000 streams had 37% of its statuses after 1.2–1.9 s that way.
pub fn bind(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does on Unix: a restart can bind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// What one client may take of the server.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves; then accepts nothing more and returns
/// once every open connection finished its requests (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, mostly: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;
    use std::time::Duration;

    /// With nothing accepted yet, connections past tokio's default backlog of 128 still
    /// complete at once: the kernel queues them (up to `net.core.somaxconn`) instead of
    /// dropping their handshakes for a 1 s retransmission.
    #[tokio::test]
    async fn the_listener_queues_a_burst_past_128_connections() {
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if somaxconn <= 256 {
            eprintln!("net.core.somaxconn is {somaxconn}: the kernel caps the backlog; skipped");
            return;
        }
        let burst = (somaxconn - 1).min(600);
        let listener = super::bind("127.0.0.1:0".parse().unwrap(), 4096).unwrap();
        let addr = listener.local_addr().unwrap();
        let held: Vec<TcpStream> = (0..burst)
            .map(|i| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(900))
                    .unwrap_or_else(|e| panic!("connection {i} of {burst} not queued: {e}"))
            })
            .collect();
        assert_eq!(held.len(), burst);
    }
}
