//! The HTTP server of the api-server and the token-processor: hyper's HTTP/1.1 connection
//! builder under an axum router, with the limits `axum::serve` does not offer. A client must send a request's headers within
//! `header_read_timeout` (also the idle limit of a kept-alive connection), so a slow or silent
//! client cannot hold a connection forever; a write blocked for `write_timeout` ends the
//! connection, so a client that stops reading cannot hold a response either; at most `max_connections` are open at once (beyond
//! it, new connections wait in the kernel's backlog); on shutdown no connection is accepted and
//! open ones finish their requests.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;

use crate::write_deadline::WriteDeadline;

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
    // Inherited by every accepted connection (see [`SEND_BUFFER_BYTES`]).
    socket.set_send_buffer_size(SEND_BUFFER_BYTES)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// hyper's buffer per connection (its default is about 400 KiB).
pub const MAX_BUF_BYTES: usize = 64 * 1024;

/// The kernel's send buffer per connection (Linux doubles it for its own bookkeeping). Left to
/// autotuning it grows to megabytes for a client that stops reading on loopback (64 KiB
/// segments), so a stream's write timeout would start only after minutes of output; a fixed
/// buffer bounds that, and still moves a whole response of many choices at a few MB/s on a
/// 100 ms path.
pub const SEND_BUFFER_BYTES: u32 = 128 * 1024;

/// What one client may take of the server.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    /// A write that makes no progress for this long ends the connection
    /// ([`WriteDeadline`](crate::write_deadline::WriteDeadline)): no response, whole or
    /// streamed, is held for a client that stopped reading.
    pub write_timeout: Duration,
    pub max_connections: usize,
}

/// File descriptors kept out of the HTTP connection cap: the process's own files, its ZeroMQ
/// peers and their reconnects, so a flood of HTTP connections never starves the links.
pub const RESERVED_DESCRIPTORS: usize = 512;

/// Raises the soft limit on open files to the hard one (as Go's runtime does at start; the
/// soft default of 1,024 is a relic of `select`) and returns the soft limit now in force.
pub fn raise_open_files_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

/// The connection cap in force: `requested`, but never so many that HTTP connections take the
/// descriptors the process needs for anything else.
pub fn connection_cap(requested: usize, open_files_limit: usize) -> usize {
    requested
        .min(open_files_limit.saturating_sub(RESERVED_DESCRIPTORS))
        .max(1)
}

/// Serves `app` on `listener` until `shutdown` resolves; then accepts nothing more and returns
/// once every open connection finished its requests (the caller bounds that wait). The
/// connection cap is `limits.max_connections` within the open-files limit
/// ([`connection_cap`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        // What hyper buffers of a response the client has not taken: the stream write timeout
        // starts once this and the socket's buffers are full. Also the largest request head.
        .max_buf_size(MAX_BUF_BYTES);
    let cap = connection_cap(limits.max_connections, raise_open_files_limit());
    if cap < limits.max_connections {
        tracing::warn!(
            requested = limits.max_connections,
            cap,
            "HTTP connection cap lowered to fit the open-files limit"
        );
    }
    let connections = Arc::new(Semaphore::new(cap));
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
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
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
        let socket = ConnectionSocket(stream.as_raw_fd());
        let stream = WriteDeadline::new(stream, limits.write_timeout);
        let connection = http.serve_connection(TokioIo::new(stream), with_peer(&app, peer, socket));
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

/// The accepted socket of a request's connection, to judge whether its client still reads
/// (a response's body task holds it no longer than the connection: when the connection ends,
/// the body is dropped and the task stops).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionSocket(RawFd);

/// What a connection's socket says of the bytes written to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Bytes the client has acknowledged since the connection opened.
    pub acked: u64,
    /// Bytes written and not yet acknowledged (sent or still queued in the kernel).
    pub pending: u64,
}

impl ConnectionSocket {
    /// The kernel's figures now (`TCP_INFO`, `SIOCOUTQ`); None if the socket is gone.
    pub fn delivery(&self) -> Option<Delivery> {
        // SAFETY: both calls only write into the values passed, sized as given; a closed or
        // reused descriptor makes them fail or describe another socket, never corrupt memory.
        unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let got = libc::getsockopt(
                self.0,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            );
            if got != 0 {
                return None;
            }
            let mut queued: libc::c_int = 0;
            if libc::ioctl(self.0, libc::TIOCOUTQ, &mut queued) != 0 {
                return None;
            }
            Some(Delivery {
                acked: info.tcpi_bytes_acked,
                pending: u64::try_from(queued).unwrap_or(0),
            })
        }
    }
}

/// `app` for one connection from `peer` on `socket`: each request carries the address as
/// `ConnectInfo<SocketAddr>` (the api-server's fair admission tells clients apart by it) and
/// the [`ConnectionSocket`].
fn with_peer(
    app: &Router,
    peer: SocketAddr,
    socket: ConnectionSocket,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    let app = TowerToHyperService::new(app.clone());
    hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request.extensions_mut().insert(socket);
        app.call(request)
    })
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;
    use std::time::Duration;

    #[test]
    fn the_cap_leaves_descriptors_for_everything_else() {
        assert_eq!(super::connection_cap(16_384, 65_536), 16_384);
        assert_eq!(super::connection_cap(16_384, 1024), 1024 - 512);
        assert_eq!(super::connection_cap(16_384, 100), 1);
        assert!(super::raise_open_files_limit() >= 1024);
    }

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
