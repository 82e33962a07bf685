//! A stranger on a ZeroMQ tcp endpoint: a valid ZMTP greeting followed by a frame header that
//! declares an absurd length (up to 2^64 − 1), and one that starts an endless multipart
//! message. Unpatched, zeromq 0.7.0 reserved the declared length and aborted the process; with
//! the bound in `vendor/zeromq` (PATCH.md) the connection is dropped. Every process must be
//! alive and serving afterwards, on every endpoint, and twenty connections that each declare a
//! frame just under the bound (60 MiB) and send nothing more must not make it resident.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::openai::{complete, completion_body};
use common::rss_kib;
use common::stack::{Proc, Stack, StackConfig, ZMQ_ENDPOINTS};

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

/// Sends the greeting and the attack, then reads until the peer drops us; whether it did
/// within 5 s (a read that times out means the connection was kept).
fn attack(addr: &str, payload: &[u8]) -> bool {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(&greeting());
    // The peer may drop us before it has read all of the payload: that is the reset here.
    let _ = s.write_all(payload);
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true, // reset
        }
    }
}

/// The largest RSS of `pid` over `window`, sampled every 20 ms: what the process reached while
/// it read the held connections, rather than one reading after a guessed delay.
async fn peak_rss_kib(pid: u32, window: Duration) -> u64 {
    let start = std::time::Instant::now();
    let mut peak = rss_kib(pid);
    while start.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(20)).await;
        peak = peak.max(rss_kib(pid));
    }
    peak
}

/// Connections that each declare a frame just under the bound and then send nothing (what a
/// patched decoder still accepts), held open together.
const UNDER_THE_BOUND: usize = 20;
/// Growth allowed per process while they are held: the declared lengths must not be resident.
const HELD_GROWTH_KIB: u64 = 64 * 1024;

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
        let addr = stack
            .endpoint(name)
            .trim_start_matches("tcp://")
            .to_string();
        for (what, payload) in attacks() {
            let addr = addr.clone();
            let dropped = tokio::task::spawn_blocking(move || attack(&addr, &payload))
                .await
                .unwrap();
            assert!(dropped, "{what} on {name}: the connection was kept");
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
        for (p, before) in Proc::ALL.iter().zip(&before) {
            let after = peak_rss_kib(stack.pid(*p), Duration::from_secs(1)).await;
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
