//! A stranger on a ZeroMQ tcp endpoint: a valid ZMTP greeting followed by a frame header that
//! declares an absurd length (up to 2^64 − 1), and one that starts an endless multipart
//! message. Unpatched, zeromq 0.7.0 reserved the declared length and aborted the process; with
//! the bound in `vendor/zeromq` (PATCH.md) the connection is dropped: the client reads the end
//! of its stream (or a reset) while a fresh connection's greeting is still answered. Every
//! process must be alive and serving afterwards, on every endpoint, and twenty connections that
//! each declare a frame just under the bound (60 MiB) and send nothing more must not make it
//! resident once it has read them.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::openai::{complete, completion_body};
use common::stack::{Proc, Stack, StackConfig, ZMQ_ENDPOINTS};
use common::timing::PATIENCE;
use common::{rss_kib, wait_until};

/// ZMTP 3.0 greeting, NULL mechanism, as a DEALER would send it (64 bytes).
fn greeting() -> Vec<u8> {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    let mut mechanism = b"NULL".to_vec();
    mechanism.resize(20, 0);
    g.extend(mechanism);
    g.push(0); // as-server
    g.resize(64, 0);
    g
}

/// What a stranger sends after the greeting.
fn attacks() -> Vec<(&'static str, Vec<u8>)> {
    let long = |len: u64| {
        let mut v = vec![0x02]; // long message frame
        v.extend(len.to_be_bytes());
        v
    };
    let mut endless = Vec::new();
    for _ in 0..100_000 {
        endless.extend([0x01, 0x00]); // empty frame, more to come
    }
    vec![
        ("2^64-1", long(u64::MAX)),
        ("2^63-1", long(i64::MAX as u64)),
        ("8 GiB", long(8 << 30)),
        ("command 2^62", {
            let mut v = vec![0x06];
            v.extend((1u64 << 62).to_be_bytes());
            v
        }),
        ("100k empty frames", endless),
    ]
}

/// How a connection ended, as its client saw it.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The peer closed it (end of stream).
    Closed,
    /// The peer reset it (it closed with our bytes unread).
    Reset,
    /// Still open when the read timed out.
    Kept,
}

/// Sends the greeting and the attack, then reads until the peer drops us (or 5 s pass); how
/// the connection ended and how many bytes the peer sent before.
fn attack(addr: &str, payload: &[u8]) -> (End, usize) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(&greeting());
    // The peer may drop us before it has read all of the payload: that is the reset here.
    let _ = s.write_all(payload);
    let mut buf = [0u8; 4096];
    let mut received = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (End::Closed, received),
            Ok(n) => received += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (End::Kept, received)
            }
            Err(_) => return (End::Reset, received),
        }
    }
}

/// A fresh connection that sends only the greeting gets the peer's (a 64-byte ZMTP greeting):
/// the endpoint answers, so a dropped connection was dropped for what followed its greeting.
fn answers_a_greeting(addr: &str) -> bool {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(&greeting());
    let mut theirs = [0u8; 64];
    s.read_exact(&mut theirs).is_ok() && theirs[0] == 0xff && theirs[9] == 0x7f
}

/// For each connection from one of `client_ports` to `server_port` on loopback, the bytes that
/// reached the server's socket and that the server has not read yet (`/proc/net/tcp`); None
/// for one the server no longer has.
fn unread_by_the_server(server_port: u16, client_ports: &[u16]) -> Vec<Option<u64>> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    let sockets: Vec<(u16, u16, u64)> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (_, rx) = f.get(4)?.split_once(':')?;
            Some((
                port(f.get(1)?)?,
                port(f.get(2)?)?,
                u64::from_str_radix(rx, 16).ok()?,
            ))
        })
        .collect();
    client_ports
        .iter()
        .map(|client| {
            sockets
                .iter()
                .find(|(local, remote, _)| *local == server_port && remote == client)
                .map(|(_, _, unread)| *unread)
        })
        .collect()
}

/// Connections that each declare a frame just under the bound and then send nothing (what a
/// patched decoder still accepts), held open together.
const UNDER_THE_BOUND: usize = 20;
/// Growth allowed per process while they are held: the declared lengths must not be resident.
const HELD_GROWTH_KIB: u64 = 64 * 1024;

/// `host:port` of one of the stack's tcp endpoints.
fn addr_of(stack: &Stack, name: &str) -> String {
    stack
        .endpoint(name)
        .trim_start_matches("tcp://")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crafted_frame_headers_on_every_tcp_endpoint_abort_nothing() {
    let stack = Stack::start(StackConfig {
        tcp: true,
        ..StackConfig::default()
    })
    .await;
    let url = stack.api("/v1/completions");
    let body = completion_body("Count to five:", 8, false);
    let (status, _) = complete(stack.client(), &url, &body).await;
    assert_eq!(status, 200);
    for name in ZMQ_ENDPOINTS {
        let addr = addr_of(&stack, name);
        for (what, payload) in attacks() {
            let addr = addr.clone();
            let (end, received) = tokio::task::spawn_blocking(move || attack(&addr, &payload))
                .await
                .unwrap();
            assert_ne!(
                end,
                End::Kept,
                "{what} on {name}: the connection was kept ({received} bytes received)"
            );
            let fresh = addr_of(&stack, name);
            assert!(
                tokio::task::spawn_blocking(move || answers_a_greeting(&fresh))
                    .await
                    .unwrap(),
                "after {what} on {name}: a fresh connection's greeting was not answered"
            );
            for p in Proc::ALL {
                assert!(
                    stack.is_running(p),
                    "{p:?} died after {what} on {name}:\n{}",
                    stack.log(p)
                );
            }
        }
        // Declared lengths just under the bound, many at once: reserved perhaps, never resident.
        let before: Vec<u64> = Proc::ALL.iter().map(|p| rss_kib(stack.pid(*p))).collect();
        let held: Vec<TcpStream> = (0..UNDER_THE_BOUND)
            .map(|_| {
                let mut s = TcpStream::connect(&addr).expect("connect");
                let _ = s.write_all(&greeting());
                let mut frame = vec![0x02];
                frame.extend((60u64 << 20).to_be_bytes());
                let _ = s.write_all(&frame);
                s
            })
            .collect();
        // RSS once the process has read every header (or dropped the connection), sampled
        // throughout the wait: what it made resident on reading them.
        let server_port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
        let client_ports: Vec<u16> = held
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        let mut peak = before.clone();
        wait_until(PATIENCE, "the held connections' headers read", || {
            for (p, peak) in Proc::ALL.iter().zip(peak.iter_mut()) {
                *peak = (*peak).max(rss_kib(stack.pid(*p)));
            }
            let unread = unread_by_the_server(server_port, &client_ports);
            async move { unread.iter().all(|u| u.is_none_or(|bytes| bytes == 0)) }
        })
        .await;
        // And after the processes have answered again (their reads are behind them).
        stack.wait_healthy(PATIENCE).await;
        for ((p, before), peak) in Proc::ALL.iter().zip(&before).zip(&peak) {
            let after = (*peak).max(rss_kib(stack.pid(*p)));
            assert!(
                after <= before + HELD_GROWTH_KIB,
                "{p:?} RSS {before} → {after} kB with {UNDER_THE_BOUND} connections declaring \
                 60 MiB frames on {name}"
            );
        }
        drop(held);
        // Still serving: the stack as a whole, through every link.
        stack.wait_healthy(Duration::from_secs(30)).await;
        let (status, v) = complete(stack.client(), &url, &body).await;
        assert_eq!(status, 200, "after the attacks on {name}: {v}");
        eprintln!(
            "{name}: {} crafted connections dropped, every process serving",
            attacks().len()
        );
    }
}
