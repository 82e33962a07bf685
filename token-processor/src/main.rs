//! token-processor: specula's acceptance-tracking sidecar (see the crate docs), and
//! `token-processor replay FILE` for acceptance traces.

/// mimalloc: a 512-row batch allocates ~500 small token vectors that the forwarder frees on
/// another thread; measured in docs/history/benchmarks-notebook.md (token-processor, allocator).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};

use link::service;
use token_processor::replay::{self, Batching, Trace};
use token_processor::serve::{ServeConfig, TokenProcessor};
use token_processor::{memory, whatif};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "specula token-processor: per-request acceptance tracking, /metrics, output forwarding"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeConfig,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replays an acceptance trace (a golden case file or the engine-worker's JSON Lines) and
    /// prints {"requests": {...}, "global": {...}}; with --what-if, re-scores a worker's trace
    /// at every K' <= K under the fixed and goodput policies and writes a report.
    Replay {
        /// The trace file.
        #[arg(required_unless_present = "what_if", conflicts_with = "what_if")]
        file: Option<PathBuf>,
        /// A trace the engine-worker wrote with --trace-acceptance, to re-score.
        #[arg(long, requires = "out")]
        what_if: Option<PathBuf>,
        /// Where --what-if writes report.html and report.json (created if missing).
        #[arg(long, requires = "what_if")]
        out: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Replay {
            what_if: Some(trace),
            out: Some(dir),
            ..
        }) => what_if(&trace, &dir),
        Some(Command::Replay { file, .. }) => {
            let file = file.context("a trace file is required")?;
            let trace = Trace::load(&file)?;
            let result = replay::run(&trace, Batching::Packed);
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(())
        }
        None => {
            cli.serve.service.init_tracing();
            if let Err(e) = memory::disable_transparent_huge_pages() {
                tracing::warn!(error = %e, "could not turn transparent huge pages off; batches may stall on 2 MiB page faults");
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(return_idle_memory)
                .build()?;
            runtime.block_on(serve(cli.serve))
        }
    }
}

/// `replay --what-if TRACE --out DIR`: the report, and a one-line summary per setting.
fn what_if(path: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    let trace = whatif::WhatIfTrace::load(path)?;
    let (recorded, predictions) = whatif::predict(&trace);
    println!(
        "recorded: K={} {:.1} tokens/s ({} tokens in {:.2} s)",
        recorded.num_spec_tokens, recorded.tokens_per_s, recorded.tokens, recorded.seconds
    );
    for p in &predictions {
        println!(
            "{:?} K'={}: {:.3} accepted/step, predicted {:.1} tokens/s",
            p.policy, p.num_spec_tokens, p.accepted_per_step, p.predicted_tokens_per_s
        );
    }
    let report = whatif::Report {
        trace: path.display().to_string(),
        proposer: trace.proposer.clone(),
        model: trace.model.clone(),
        recorded,
        what_if: predictions,
        method: whatif::METHOD.to_vec(),
    };
    whatif::write_report(dir, &report)?;
    println!("wrote {}", dir.join("report.html").display());
    Ok(())
}

/// Called as a runtime thread goes idle: at most once a second per thread, hands that thread's
/// empty mimalloc pages back and purges expired free ranges, so RSS after a burst falls back to
/// live memory instead of holding the burst's peak until the thread next allocates.
fn return_idle_memory() {
    thread_local! {
        static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = Instant::now();
    if LAST
        .get()
        .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
    {
        return;
    }
    LAST.set(Some(now));
    // SAFETY: mi_collect only walks the calling thread's own heap and the shared arenas, under
    // mimalloc's own synchronisation; it is callable from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(false) };
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let (ingest, api) = (config.ingest_endpoint.clone(), config.api_endpoint.clone());
    let running = TokenProcessor::start(config).await?;
    tracing::info!(ingest = %ingest, api = %api, http = %running.http_addr(), "token-processor ready");
    service::notify_ready();

    service::shutdown_signal().await;
    tracing::info!("shutting down: stopping ingest, flushing outputs");
    service::notify_stopping();
    running.stop().await;
    Ok(())
}
