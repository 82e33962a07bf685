//! The CPU backend as the reference for logprobs: a full-vocabulary log-softmax of its logits,
//! computed in the test from the default model's weights with the stack's default (f16) KV
//! cache.

use engine_worker::backend::cpu::{CpuBackend, CpuBackendOptions};
use engine_worker::backend::{Backend, LogitsFor, SeqForward};
use engine_worker::kv::KvDtype;
use engine_worker::model::load_gguf;

/// The default model on the CPU backend, 16 KV blocks.
pub fn backend() -> CpuBackend {
    let model = load_gguf(&super::default_model()).unwrap();
    let mut options = CpuBackendOptions::new(16);
    options.kv_dtype = KvDtype::F16;
    CpuBackend::new(model, options).unwrap()
}

/// `log_softmax(row)` in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// One forward over the whole prompt: row `i` is the log-softmax that scores token `i + 1`.
pub fn prompt_rows(backend: &mut CpuBackend, prompt: &[u32]) -> Vec<Vec<f64>> {
    let table: Vec<u32> = (0..16).collect();
    let vocab = backend.config().vocab_size;
    let logits = backend
        .forward(&[SeqForward::new(prompt, 0, &table, LogitsFor::All)])
        .unwrap();
    logits.chunks_exact(vocab).map(log_softmax).collect()
}
