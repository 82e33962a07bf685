//! tp-bench: starts a real `token-processor` (the binary next to this one) on ipc endpoints,
//! pushes synthetic step batches to it as a fake engine-worker while a fake api-server drains
//! the outputs, and reports sustained batches/s, request-steps/s and per-batch processing time
//! (the TP's own histogram, plus an exact in-process decode+handle timing of the same frames).
//! Then pushes short requests until 1M have finished and samples the TP's RSS.
//! `--dump-dir` writes each configuration's batches as JSON Lines for
//! `scripts/bench/fd_reference.py`, so both sides process the same batches.

/// mimalloc: a 512-row batch allocates ~500 small token vectors that the forwarder frees on
/// another thread; measured in docs/history/benchmarks-notebook.md (token-processor, allocator).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use proto::api_worker::ApiHello;
use proto::tp_api::ApiToTp;
use proto::worker_tp::{Heartbeat, Resync, StepBatch, WorkerHello, WorkerToTp};
use token_processor::ingest::{Ingest, IngestConfig};
use token_processor::synth::{Synth, SynthConfig};
use token_processor::tracker::{Clock, Outbox};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

#[derive(Debug, Parser)]
#[command(about = "Throughput/latency/RSS benchmark of a running token-processor over ipc")]
struct Args {
    /// The token-processor binary (default: next to this one).
    #[arg(long, env = "TP_BENCH_TP")]
    tp: Option<PathBuf>,
    /// Rows per batch to measure.
    #[arg(
        long,
        env = "TP_BENCH_ROWS",
        value_delimiter = ',',
        default_value = "64,256,512"
    )]
    rows: Vec<usize>,
    /// K values to measure.
    #[arg(long, env = "TP_BENCH_K", value_delimiter = ',', default_value = "4,8")]
    k: Vec<u8>,
    /// Request-steps (rows) pushed per configuration.
    #[arg(long, env = "TP_BENCH_ROW_BUDGET", default_value_t = 2_000_000)]
    row_budget: usize,
    /// Finished requests for the RSS run (0 skips it).
    #[arg(long, env = "TP_BENCH_RSS_REQUESTS", default_value_t = 1_000_000)]
    rss_requests: u64,
    /// Batches per second in the RSS run: still ~10x an engine's step rate, but slow enough
    /// that RSS shows the tracker's state rather than a forwarding backlog.
    #[arg(long, env = "TP_BENCH_RSS_RATE", default_value_t = 2_000)]
    rss_rate: u32,
    /// Write each configuration's first `dump_batches` batches as JSON Lines here.
    #[arg(long, env = "TP_BENCH_DUMP_DIR")]
    dump_dir: Option<PathBuf>,
    #[arg(long, env = "TP_BENCH_DUMP_BATCHES", default_value_t = 2_000)]
    dump_batches: usize,
    #[arg(long, env = "TP_BENCH_SEED", default_value_t = 42)]
    seed: u64,
    /// Push at this many batches per second instead of as fast as the socket takes them (an
    /// engine steps tens to hundreds of times a second): the TP's p50/p99 are then its own
    /// processing time, not time shared with the sender on the same cores. 0 floods.
    #[arg(long, env = "TP_BENCH_RATE", default_value_t = 0)]
    rate: u32,
    /// Run without the fake api-server (outputs are dropped at the forwarder as "owner not
    /// connected"), to separate forwarding from tracking.
    #[arg(long, env = "TP_BENCH_NO_API_SERVER")]
    no_api_server: bool,
    /// Pin this process (fake worker and api-server) to CPU 0 and the token-processor to CPU 1,
    /// so the harness's threads do not preempt the process being measured (on a 2-core machine
    /// they otherwise share both cores with it; in production the engine and api-server run on
    /// cores of their own).
    #[arg(long, env = "TP_BENCH_PIN")]
    pin: bool,
}

/// The CPUs `--pin` uses: the harness's, then the token-processor's.
const PIN_CPUS: (usize, usize) = (0, 1);

/// Restricts the calling thread (and the threads it starts afterwards) to `cpu`. Only raw
/// syscalls, so it may run between fork and exec.
fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it; sched_setaffinity
    // reads `size_of::<cpu_set_t>()` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

struct Tp {
    child: Child,
    http_port: u16,
}

impl Drop for Tp {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// Sum of a series family's samples whose line starts with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix).and_then(|r| r.trim().parse().ok()))
}

/// p-quantile from the TP's cumulative histogram buckets: the first bucket bound reaching it.
fn histogram_quantile(text: &str, worker: &str, q: f64) -> Option<f64> {
    let name = "specula_step_batch_processing_seconds_bucket{";
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("worker=\"{worker}\"")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    buckets
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| *le)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn hello(worker_id: &str, k: u8) -> WorkerToTp {
    WorkerToTp::Hello(WorkerHello {
        protocol_version: proto::PROTOCOL_VERSION,
        worker_id: worker_id.into(),
        epoch: 1,
        model: "bench".into(),
        num_spec_tokens: u32::from(k),
        proposer: "synthetic".into(),
        ready: true,
        heartbeat_interval_ms: 60_000,
        max_model_len: 2048,
        kv_capacity_tokens: 32_768,
        kv_bytes: 0,
        draft_kv_bytes: 0,
        max_num_seqs: 16,
        session: 7,
    })
}

fn synth(worker_id: &str, rows: usize, k: u8, min_len: u32, max_len: u32, seed: u64) -> Synth {
    Synth::new(SynthConfig {
        worker_id: worker_id.into(),
        epoch: 1,
        rows,
        num_spec_tokens: k,
        min_len,
        max_len,
        accept_p: 0.7,
        owner: "bench-api".into(),
        seed,
    })
}

/// What a worker says on connecting: hello, then an empty resync (sequence starts at 0).
async fn introduce(worker: &mut DealerSocket, worker_id: &str, k: u8) -> anyhow::Result<()> {
    push(worker, &hello(worker_id, k)).await?;
    let resync = Resync {
        worker_id: worker_id.into(),
        epoch: 1,
        next_seq: 0,
        requests: vec![],
    };
    push(worker, &WorkerToTp::Resync(resync)).await
}

/// Waits until message `i` is due at `rate` per second from `start` (0: never waits).
async fn pace(start: tokio::time::Instant, i: usize, rate: u32) {
    if rate > 0 {
        let due = Duration::from_secs_f64(i as f64 / f64::from(rate));
        tokio::time::sleep_until(start + due).await;
    }
}

async fn push(worker: &mut DealerSocket, msg: &WorkerToTp) -> anyhow::Result<()> {
    worker.send(ZmqMessage::from(proto::encode(msg)?)).await?;
    Ok(())
}

/// Waits until the TP has processed `batches` step batches of `worker`, heartbeating every
/// 100 ms meanwhile as a real worker does (with `next_seq` = what was sent), and says so on
/// stderr when that takes over a second: about once per ~80 flooded configurations zeromq-rs's
/// writer (then PUSH) stopped writing (docs/history/benchmarks-notebook.md, "A zeromq-rs stall").
async fn wait_processed(
    port: u16,
    worker: &mut DealerSocket,
    worker_id: &str,
    sent: usize,
    batches: usize,
) -> anyhow::Result<String> {
    let series = format!(
        "specula_step_batch_processing_seconds_count{{model=\"bench\",worker=\"{worker_id}\"}}"
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut next_heartbeat = Instant::now() + Duration::from_millis(100);
    let (waited_since, mut reported) = (Instant::now(), false);
    loop {
        let text = http_get(port, "/metrics").await?;
        if sample(&text, &series).unwrap_or(0.0) as usize >= batches {
            return Ok(text);
        }
        if Instant::now() > deadline {
            bail!("token-processor did not process {batches} batches of {worker_id} in time");
        }
        if Instant::now() >= next_heartbeat {
            if Instant::now() > waited_since + Duration::from_secs(1) && !reported {
                reported = true;
                eprintln!(
                    "# {worker_id}: still waiting for {batches} batches after 1 s; heartbeating"
                );
            }
            let hb = WorkerToTp::Heartbeat(Heartbeat::idle(worker_id.into(), 1, sent as u64));
            push(worker, &hb).await?;
            next_heartbeat = Instant::now() + Duration::from_millis(100);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Same allocator setup as the token-processor, so the fake worker and api-server do not
    // spend the shared cores zeroing huge pages.
    token_processor::memory::disable_transparent_huge_pages()?;
    if args.pin {
        // Before the runtime starts, so its threads inherit the mask.
        pin_to_cpu(PIN_CPUS.0).context("pinning tp-bench (--pin needs 2 CPUs)")?;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let endpoints = Endpoints::in_temp_dir()?;
    let tp = start_token_processor(&args, &endpoints).await?;
    let drained = Arc::new(AtomicU64::new(0));
    if !args.no_api_server {
        start_fake_api_server(&endpoints.api, drained.clone()).await?;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut worker = DealerSocket::new();
    worker.connect(&endpoints.ingest).await?;
    print_preamble(&args, tp.child.id());
    print_throughput_header();
    let mut dropped_before = 0.0;
    for &k in &args.k {
        for &rows in &args.rows {
            let worker_id = format!("bench-{rows}-k{k}");
            let frames = prepare_frames(&args, &worker_id, rows, k)?;
            let in_process = time_in_process(&frames, &worker_id, k)?;
            let over_ipc = push_over_ipc(&args, &tp, &mut worker, &worker_id, k, &frames).await?;
            print_throughput_row(rows, k, &worker_id, &in_process, &over_ipc, dropped_before);
            dropped_before = over_ipc.dropped_total;
        }
    }
    if args.rss_requests > 0 {
        let rss = measure_rss(&args, &tp, &mut worker).await?;
        print_rss(&rss, args.rss_rate);
    }
    print_totals(&tp, &drained).await?;
    drop(tp);
    let _ = std::fs::remove_dir_all(&endpoints.dir);
    Ok(())
}

/// Where the token-processor under test binds: ipc sockets in a directory of this run's own.
struct Endpoints {
    dir: PathBuf,
    ingest: String,
    api: String,
}

impl Endpoints {
    fn in_temp_dir() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("tp-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            ingest: format!("ipc://{}/ingest.ipc", dir.display()),
            api: format!("ipc://{}/api.ipc", dir.display()),
            dir,
        })
    }
}

/// Spawns the token-processor (pinned with `--pin`) and waits until it serves `/metrics`.
async fn start_token_processor(args: &Args, endpoints: &Endpoints) -> anyhow::Result<Tp> {
    let tp_bin = match args.tp.clone() {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("token-processor"),
    };
    let http_port = free_port();
    let mut command = Command::new(&tp_bin);
    if args.pin {
        // SAFETY: the closure only makes the sched_setaffinity syscall (async-signal-safe).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || pin_to_cpu(PIN_CPUS.1));
        }
    }
    let child = command
        .args([
            "--ingest-endpoint",
            &endpoints.ingest,
            "--api-endpoint",
            &endpoints.api,
        ])
        .args([
            "--metrics-port",
            &http_port.to_string(),
            "--max-spec-tokens",
            "8",
            "--max-workers",
            "64",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {}", tp_bin.display()))?;
    let tp = Tp { child, http_port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(tp.http_port, "/metrics").await.is_err() {
        if Instant::now() > deadline {
            bail!("token-processor did not come up");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(tp)
}

/// The fake api-server: says hello, heartbeats, and counts every output message into `drained`.
async fn start_fake_api_server(endpoint: &str, drained: Arc<AtomicU64>) -> anyhow::Result<()> {
    let mut api = DealerSocket::new();
    api.connect(endpoint).await?;
    let api_hello = ApiToTp::Hello(ApiHello {
        protocol_version: proto::PROTOCOL_VERSION,
        api_server_id: "bench-api".into(),
        epoch: 1,
    });
    api.send(ZmqMessage::from(proto::encode(&api_hello)?))
        .await?;
    tokio::spawn(async move {
        let heartbeat = proto::encode(&ApiToTp::Heartbeat {
            api_server_id: "bench-api".into(),
            epoch: 1,
        })
        .unwrap();
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                msg = api.recv() => if msg.is_ok() { drained.fetch_add(1, Ordering::Relaxed); },
                _ = tick.tick() => { let _ = api.send(ZmqMessage::from(heartbeat.clone())).await; }
            }
        }
    });
    Ok(())
}

fn print_preamble(args: &Args, tp_pid: u32) {
    println!(
        "# token-processor pid {tp_pid}, RSS at start {} KiB; pushing {}; {}",
        rss_kib(tp_pid),
        match args.rate {
            0 => "as fast as the socket takes them".to_owned(),
            r => format!("{r} batches/s"),
        },
        if args.pin {
            format!(
                "pinned: tp-bench to CPU {}, token-processor to CPU {}",
                PIN_CPUS.0, PIN_CPUS.1
            )
        } else {
            "not pinned".to_owned()
        }
    );
}

fn print_throughput_header() {
    println!(
        "| rows | K | batches | batches/s | request-steps/s | TP p50 ≤ | TP p99 ≤ | TP p99.9 ≤ | in-process p50 | in-process p99 | outputs dropped |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

/// One configuration's synthetic batches, encoded as step frames (and dumped with `--dump-dir`).
fn prepare_frames(
    args: &Args,
    worker_id: &str,
    rows: usize,
    k: u8,
) -> anyhow::Result<Vec<Vec<u8>>> {
    let n = (args.row_budget / rows).max(100);
    let mut gen = synth(worker_id, rows, k, 16, 512, args.seed);
    let batches: Vec<_> = (0..n).map(|_| gen.next_batch()).collect();
    if let Some(dump) = &args.dump_dir {
        dump_batches(dump, &batches, rows, k, args.dump_batches)?;
    }
    Ok(batches
        .into_iter()
        .map(|b| proto::encode(&WorkerToTp::Step(b)))
        .collect::<Result<_, _>>()?)
}

/// Writes the first `count` batches as JSON Lines, after a line naming K and the rows.
fn dump_batches(
    dump: &Path,
    batches: &[StepBatch],
    rows: usize,
    k: u8,
    count: usize,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dump)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(
        dump.join(format!("rows{rows}_k{k}.jsonl")),
    )?);
    writeln!(
        f,
        "{}",
        serde_json::json!({"num_spec_tokens": k, "rows": rows})
    )?;
    for b in batches.iter().take(count) {
        writeln!(f, "{}", Synth::to_json(b))?;
    }
    Ok(())
}

/// Decode + handle of the same frames in this process, timed one by one: seconds per batch,
/// sorted.
fn time_in_process(frames: &[Vec<u8>], worker_id: &str, k: u8) -> anyhow::Result<Vec<f64>> {
    let mut ingest = Ingest::new(IngestConfig::default());
    let mut out = Outbox::default();
    let origin = Instant::now();
    let clock = || Clock {
        mono_ns: origin.elapsed().as_nanos() as u64,
        unix_ms: 0,
    };
    ingest.handle(hello(worker_id, k), clock(), Instant::now(), &mut out);
    let mut times = Vec::with_capacity(frames.len());
    for frame in frames {
        let t = Instant::now();
        let msg: WorkerToTp = proto::decode(frame)?;
        ingest.handle(msg, clock(), t, &mut out);
        drop(out.take());
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// What pushing one configuration's frames to the running token-processor measured.
struct OverIpc {
    batches: usize,
    elapsed_s: f64,
    /// The TP's `/metrics` once it had processed them all.
    metrics: String,
    /// `specula_outputs_dropped_total` then (over the whole run so far).
    dropped_total: f64,
}

/// Pushes the frames over ipc as a fake worker (paced with `--rate`), waits until the TP has
/// processed them all, and says goodbye.
async fn push_over_ipc(
    args: &Args,
    tp: &Tp,
    worker: &mut DealerSocket,
    worker_id: &str,
    k: u8,
    frames: &[Vec<u8>],
) -> anyhow::Result<OverIpc> {
    let n = frames.len();
    introduce(worker, worker_id, k).await?;
    let start = Instant::now();
    let start_at = tokio::time::Instant::now();
    for (i, frame) in frames.iter().enumerate() {
        pace(start_at, i, args.rate).await;
        worker.send(ZmqMessage::from(frame.clone())).await?;
    }
    wait_processed(tp.http_port, worker, worker_id, n, n).await?;
    let elapsed_s = start.elapsed().as_secs_f64();
    // Let the forwarder finish, so its drops are this configuration's.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = http_get(tp.http_port, "/metrics").await?;
    let dropped_total = sample(&metrics, "specula_outputs_dropped_total").unwrap_or(0.0);
    let goodbye = WorkerToTp::Goodbye {
        worker_id: worker_id.to_owned(),
        epoch: 1,
    };
    push(worker, &goodbye).await?;
    Ok(OverIpc {
        batches: n,
        elapsed_s,
        metrics,
        dropped_total,
    })
}

fn print_throughput_row(
    rows: usize,
    k: u8,
    worker_id: &str,
    in_process: &[f64],
    over_ipc: &OverIpc,
    dropped_before: f64,
) {
    let (n, elapsed) = (over_ipc.batches, over_ipc.elapsed_s);
    let q = |p| {
        histogram_quantile(&over_ipc.metrics, worker_id, p)
            .map_or("?".into(), |s| format!("{:.0} µs", s * 1e6))
    };
    println!(
        "| {rows} | {k} | {n} | {:.0} | {:.0} | {} | {} | {} | {:.1} µs | {:.1} µs | {:.0} |",
        n as f64 / elapsed,
        (n * rows) as f64 / elapsed,
        q(0.5),
        q(0.99),
        q(0.999),
        percentile(in_process, 0.5) * 1e6,
        percentile(in_process, 0.99) * 1e6,
        over_ipc.dropped_total - dropped_before,
    );
}

/// The RSS run's samples: `(finished requests, TP RSS in KiB)`.
struct RssRun {
    rows: usize,
    k: u8,
    batches: usize,
    finished: u64,
    elapsed_s: f64,
    samples: Vec<(u64, u64)>,
}

/// Pushes short requests at `--rss-rate` until `--rss-requests` have finished, sampling the TP's
/// RSS every tenth of the way and at the end.
async fn measure_rss(args: &Args, tp: &Tp, worker: &mut DealerSocket) -> anyhow::Result<RssRun> {
    let worker_id = "bench-rss";
    let (rows, k) = (512, 8);
    let tp_pid = tp.child.id();
    introduce(worker, worker_id, k).await?;
    let mut gen = synth(worker_id, rows, k, 8, 64, args.seed + 1);
    let mut sent = 0usize;
    let mut next_sample = args.rss_requests / 10;
    let mut samples = Vec::new();
    let start = Instant::now();
    let start_at = tokio::time::Instant::now();
    while gen.finished() < args.rss_requests {
        let frame = proto::encode(&WorkerToTp::Step(gen.next_batch()))?;
        pace(start_at, sent, args.rss_rate).await;
        worker.send(ZmqMessage::from(frame)).await?;
        sent += 1;
        // And at most ~256 batches in flight, so queues stay short.
        if sent.is_multiple_of(256) {
            wait_processed(tp.http_port, worker, worker_id, sent, sent - 256).await?;
        }
        if gen.finished() >= next_sample {
            wait_processed(tp.http_port, worker, worker_id, sent, sent).await?;
            samples.push((gen.finished(), rss_kib(tp_pid)));
            next_sample += args.rss_requests / 10;
        }
    }
    wait_processed(tp.http_port, worker, worker_id, sent, sent).await?;
    samples.push((gen.finished(), rss_kib(tp_pid)));
    Ok(RssRun {
        rows,
        k,
        batches: sent,
        finished: gen.finished(),
        elapsed_s: start.elapsed().as_secs_f64(),
        samples,
    })
}

fn print_rss(rss: &RssRun, rate: u32) {
    println!();
    println!(
        "# RSS over {} finished requests ({} batches of {} rows, K={}, {:.1} s, {rate} batches/s):",
        rss.finished, rss.batches, rss.rows, rss.k, rss.elapsed_s,
    );
    println!("| finished requests | TP RSS (KiB) |");
    println!("|---:|---:|");
    for (finished, kib) in &rss.samples {
        println!("| {finished} | {kib} |");
    }
}

/// The run's totals: output messages drained, outputs dropped, step-batch gaps.
async fn print_totals(tp: &Tp, drained: &AtomicU64) -> anyhow::Result<()> {
    println!();
    let text = http_get(tp.http_port, "/metrics").await?;
    println!(
        "# output messages drained by the fake api-server: {}; outputs the TP dropped (forward queue full): {}",
        drained.load(Ordering::Relaxed),
        sample(&text, "specula_outputs_dropped_total").unwrap_or(0.0)
    );
    let gaps: f64 = text
        .lines()
        .filter(|l| l.starts_with("specula_step_batch_gaps_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!("# step-batch gaps the TP detected: {gaps}");
    Ok(())
}
