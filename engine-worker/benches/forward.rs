//! Raw forward-pass throughput of the CPU backend (no scheduler, no sampling beyond argmax):
//! single-stream decode, 8-stream batched decode and prefill, on the default GGUF model or
//! dummy weights.
//!
//! `cargo bench -p engine-worker --bench forward` (env: `SPECULA_BENCH_MODEL` path,
//! `SPECULA_BENCH_THREADS`, `SPECULA_BENCH_TOKENS` decode steps (default 128),
//! `SPECULA_BENCH_PREFILLS` warm 256-token prefills (default 3), `SPECULA_BENCH_ISA`
//! avx512|avx2|scalar, `SPECULA_BENCH_STEP_SIZES` e.g. `1,8,9,16` to time verify-shaped steps
//! of those sizes).

use std::path::PathBuf;
use std::time::Instant;

use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions, Isa};
use engine_worker::backend::{Backend, LogitsFor, SeqForward};
use engine_worker::model::load_gguf;

fn env_usize(key: &str) -> Option<usize> {
    std::env::var(key).ok().and_then(|v| v.parse().ok())
}

/// CPU time of this process (user + system) from `/proc/self/stat`, in seconds; on a shared
/// machine it shows the work done, whatever the wall clock says.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesized command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(f64::NAN, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    // Linux reports these in USER_HZ, 100 on every mainstream configuration.
    ticks / 100.0
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Wall and CPU time of one phase.
struct Phase {
    wall: Instant,
    cpu: f64,
}

impl Phase {
    fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu: cpu_seconds(),
        }
    }

    /// Prints `tokens` over the phase as tokens/s (wall) and CPU-ms per token.
    fn report(self, what: &str, tokens: usize) {
        let wall = self.wall.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - self.cpu;
        println!(
            "{what}: {tokens} tokens in {:.0} ms = {:.1} tokens/s ({:.2} ms/token wall, {:.2} CPU-ms/token)",
            wall * 1e3,
            tokens as f64 / wall,
            wall * 1e3 / tokens as f64,
            cpu * 1e3 / tokens as f64,
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and then only checks
    // that the binary starts.
    if !std::env::args().any(|a| a == "--bench") {
        println!("forward: run with `cargo bench -p engine-worker --bench forward`");
        return;
    }
    let path = std::env::var("SPECULA_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    let steps = env_usize("SPECULA_BENCH_TOKENS").unwrap_or(128);
    let model = load_gguf(&path).expect("load model");
    let vocab = model.config.vocab_size;
    let mut options = CpuBackendOptions::new(512);
    options.threads = env_usize("SPECULA_BENCH_THREADS");
    options.isa = std::env::var("SPECULA_BENCH_ISA")
        .ok()
        .and_then(|v| v.parse::<Isa>().ok());
    let mut backend = CpuBackend::new(model, options).expect("backend");
    println!(
        "model {} | threads {} | isa {:?}",
        path.display(),
        backend.threads(),
        backend.isa()
    );
    // A 64-token prompt; each of 8 streams owns 64 blocks (1024 positions).
    let prompt: Vec<u32> = (0..64u32).map(|i| 1 + (i * 7919) % 40_000).collect();
    let tables: Vec<Vec<u32>> = (0..8u32).map(|s| (s * 64..s * 64 + 64).collect()).collect();

    let phase = Phase::start();
    let mut logits = backend
        .forward(&[SeqForward::new(&prompt, 0, &tables[0], LogitsFor::Last)])
        .unwrap();
    phase.report("prefill, 64-token prompt", prompt.len());

    // Warm prefill (block scales already made): a 256-token prompt, as long as an
    // input-grounded request's, into stream 7's blocks (overwritten before stream 7 runs);
    // `SPECULA_BENCH_PREFILLS` times (default 3).
    let long: Vec<u32> = (0..256u32).map(|i| 1 + (i * 7919) % 40_000).collect();
    let prefills = env_usize("SPECULA_BENCH_PREFILLS").unwrap_or(3);
    let phase = Phase::start();
    for _ in 0..prefills {
        backend
            .forward(&[SeqForward::new(&long, 0, &tables[7], LogitsFor::Last)])
            .unwrap();
    }
    phase.report("prefill, 256-token prompt (warm)", prefills * long.len());

    let mut pos = prompt.len();
    let phase = Phase::start();
    for _ in 0..steps {
        let next = [argmax(&logits)];
        logits = backend
            .forward(&[SeqForward::new(&next, pos, &tables[0], LogitsFor::Last)])
            .unwrap();
        pos += 1;
    }
    phase.report(
        &format!("decode, 1 stream (context {}..{pos})", prompt.len()),
        steps,
    );

    for table in &tables[1..] {
        backend
            .forward(&[SeqForward::new(&prompt, 0, table, LogitsFor::Last)])
            .unwrap();
    }
    let mut next = [argmax(&logits); 8];
    let mut positions = [prompt.len(); 8];
    positions[0] = pos;
    let batch_steps = steps / 2;
    let phase = Phase::start();
    for _ in 0..batch_steps {
        let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let seqs: Vec<SeqForward<'_>> = (0..8)
            .map(|s| SeqForward::new(&toks[s], positions[s], &tables[s], LogitsFor::Last))
            .collect();
        let out = backend.forward(&seqs).unwrap();
        for s in 0..8 {
            next[s] = argmax(&out[s * vocab..(s + 1) * vocab]);
            positions[s] += 1;
        }
    }
    phase.report("decode, 8 streams", 8 * batch_steps);

    let chunk = [next[0]; 5];
    let mut p = positions[0];
    let verify_steps = steps / 5;
    let phase = Phase::start();
    for _ in 0..verify_steps {
        backend
            .forward(&[SeqForward::new(&chunk, p, &tables[0], LogitsFor::All)])
            .unwrap();
        p += 5;
    }
    phase.report("verify chunks of K+1=5, 1 stream", 5 * verify_steps);

    if let Ok(list) = std::env::var("SPECULA_BENCH_STEP_SIZES") {
        let sizes: Vec<usize> = list
            .split(',')
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        step_sizes(&mut backend, &tables, &sizes);
    }
}

/// Verify-shaped steps (sequences of K+1 = 5 tokens after 256 cached positions, every row's
/// logits, as the worker's start-up calibration times them) of each size: the fastest of 7
/// interleaved rounds, in ms. Shows where the cost curve steps up: a size past a multiple of
/// the kernels' 8-token group decodes every weight block once more.
fn step_sizes(backend: &mut CpuBackend, tables: &[Vec<u32>], sizes: &[usize]) {
    let chunk = [1u32; 5];
    let mut fastest = vec![f64::INFINITY; sizes.len()];
    for _ in 0..7 {
        for (i, &total) in sizes.iter().enumerate() {
            let seqs: Vec<SeqForward<'_>> = (0..total.div_ceil(5).min(tables.len()))
                .map(|s| {
                    let n = 5.min(total - s * 5);
                    SeqForward::new(&chunk[..n], 256, &tables[s], LogitsFor::All)
                })
                .collect();
            let started = Instant::now();
            backend.forward(&seqs).unwrap();
            fastest[i] = fastest[i].min(started.elapsed().as_secs_f64());
        }
    }
    for (&total, &seconds) in sizes.iter().zip(&fastest) {
        println!(
            "verify-shaped step of {total:2} tokens: {:.2} ms",
            seconds * 1e3
        );
    }
}
