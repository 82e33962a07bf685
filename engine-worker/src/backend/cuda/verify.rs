//! Token choice and draft verification on the device for greedy batches: after the forward,
//! argmax picks each row's token and greedy acceptance compares the drafts with it, and only
//! `accepted drafts + 1` token ids and the accepted count per sequence are copied back, never
//! the `[rows, vocab]` logits.
//!
//! A sequence verifies its [`SeqForward::drafts`] (its rows score the token after each of
//! `tokens[0..]`); one with only its last row's logits drafts nothing and gets one token
//! (prefill, plain decode).
//!
//! The engine reaches this through [`Backend::forward_and_verify`](crate::backend::Backend) for
//! greedy batches: argmax over the same logits with the same tie rule is exactly the host's
//! choice. A batch with a sampled request is decided on the host, by the one rule for sampled
//! verification (`spec::verifier`: each position's own seeded draw, a draft accepted iff it
//! equals it), so there is no second, device-side sampling rule to keep in step.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::weights::{alloc, driver_err};
use super::CudaBackend;
use crate::backend::SeqForward;
use crate::spec::Verification;
use crate::EngineError;

/// Where a verify step's time went, measured when profiling is on (see
/// [`CudaBackend::set_profiling`]): the stream is synchronised between phases, so the phases
/// add up to the step but the step is a little slower than unprofiled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimings {
    /// Host preparation, upload and the forward's kernels and GEMMs.
    pub forward_s: f64,
    /// Argmax and acceptance kernels.
    pub sampling_s: f64,
    /// Copying the chosen tokens back.
    pub transfer_s: f64,
}

/// Small grow-only buffers of the verify step.
pub struct VerifyWorkspace {
    input: CudaSlice<u32>,
    output: CudaSlice<u32>,
    scratch: CudaSlice<u32>,
}

impl VerifyWorkspace {
    pub fn new(stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<Self, EngineError> {
        Ok(Self {
            input: alloc(stream, 1)?,
            output: alloc(stream, 1)?,
            scratch: alloc(stream, 1)?,
        })
    }
}

/// Offsets (in `u32`s) of the verify step's arrays in its three buffers; `S` sequences, `D` the
/// most drafts of any, `R` logit rows.
///
/// - input: drafts `[S, D]` | num_drafts `[S]` | row_offset `[S]`;
/// - output: tokens `[S, D+1]` | accepted `[S]`;
/// - scratch: argmax `[R]`.
#[derive(Debug, Clone, Copy)]
struct VerifyLayout {
    seqs: usize,
    max_drafts: usize,
    rows: usize,
    i_num: usize,
    i_off: usize,
    in_len: usize,
    o_acc: usize,
    out_len: usize,
}

impl VerifyLayout {
    fn new(seqs: usize, max_drafts: usize, rows: usize) -> Self {
        let tok_len = seqs * (max_drafts + 1);
        Self {
            seqs,
            max_drafts,
            rows,
            i_num: seqs * max_drafts,
            i_off: seqs * (max_drafts + 1),
            in_len: seqs * (max_drafts + 2),
            o_acc: tok_len,
            out_len: tok_len + seqs,
        }
    }

    /// The input buffer's contents for `seqs`.
    fn pack_inputs(&self, seqs: &[SeqForward<'_>]) -> Vec<u32> {
        let mut input = vec![0u32; self.in_len];
        let mut row = 0usize;
        for (i, s) in seqs.iter().enumerate() {
            let drafts = s.drafts();
            let d = drafts.len();
            input[i * self.max_drafts..][..d].copy_from_slice(drafts);
            input[self.i_num + i] = d as u32;
            input[self.i_off + i] = row as u32;
            row += s.logit_rows();
        }
        input
    }

    /// Each sequence's verdict from the copied-back output.
    fn verdicts(&self, out: &[u32], seqs: &[SeqForward<'_>]) -> Vec<Verification> {
        (0..self.seqs)
            .map(|i| {
                let accepted = out[self.o_acc + i] as usize;
                let base = i * (self.max_drafts + 1);
                // Only plain greedy choices run here: no logprobs to report.
                Verification::new(
                    seqs[i].drafts().len(),
                    accepted,
                    out[base..base + accepted + 1].to_vec(),
                )
            })
            .collect()
    }
}

fn per_seq_cfg(seqs: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (seqs.div_ceil(128) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn rows_cfg(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// Forward plus on-device greedy verification.
    pub fn verify_on_device(
        &mut self,
        seqs: &[SeqForward<'_>],
    ) -> Result<Vec<Verification>, EngineError> {
        let started = std::time::Instant::now();
        let rows = self.forward_on_device(seqs)?.rows;
        if self.profiling {
            self.stream.synchronize().map_err(driver_err)?;
        }
        let forward_done = std::time::Instant::now();
        let max_drafts = seqs.iter().map(|s| s.drafts().len()).max().unwrap_or(0);
        let layout = VerifyLayout::new(seqs.len(), max_drafts.max(1), rows);
        self.upload_verify_inputs(&layout, &layout.pack_inputs(seqs))?;
        self.launch_greedy(&layout)?;
        if self.profiling {
            self.stream.synchronize().map_err(driver_err)?;
        }
        let sampling_done = std::time::Instant::now();
        let out = self
            .stream
            .clone_dtoh(&self.verify_ws.output.slice(0..layout.out_len))
            .map_err(driver_err)?;
        self.stream.synchronize().map_err(driver_err)?;
        if self.profiling {
            self.last_timings = Some(StepTimings {
                forward_s: (forward_done - started).as_secs_f64(),
                sampling_s: (sampling_done - forward_done).as_secs_f64(),
                transfer_s: sampling_done.elapsed().as_secs_f64(),
            });
        }
        Ok(layout.verdicts(&out, seqs))
    }

    /// Grows the verify buffers to `layout` and copies `input` up.
    fn upload_verify_inputs(
        &mut self,
        layout: &VerifyLayout,
        input: &[u32],
    ) -> Result<(), EngineError> {
        let stream = &self.stream;
        let vw = &mut self.verify_ws;
        for (buf, len) in [
            (&mut vw.input, layout.in_len),
            (&mut vw.output, layout.out_len),
            (&mut vw.scratch, layout.rows),
        ] {
            if buf.len() < len {
                *buf = alloc(stream, len * 2)?;
            }
        }
        stream
            .memcpy_htod(input, &mut vw.input.slice_mut(0..layout.in_len))
            .map_err(driver_err)
    }

    /// Argmax of every row, then each sequence's greedy acceptance.
    fn launch_greedy(&mut self, layout: &VerifyLayout) -> Result<(), EngineError> {
        let l = layout;
        let (stream, k, logits) = (&self.stream, &self.kernels, &self.workspace.logits);
        let vw = &mut self.verify_ws;
        let inp = &vw.input;
        let drafts_v = inp.slice(0..l.i_num);
        let num_v = inp.slice(l.i_num..l.i_off);
        let off_v = inp.slice(l.i_off..l.in_len);
        let (mut g_tok, mut rest) = vw.output.split_at_mut(l.o_acc);
        let (mut g_acc, _) = rest.split_at_mut(l.out_len - l.o_acc);
        let (mut argmax, _) = vw.scratch.split_at_mut(l.rows);
        let (n_i, d_i, v_i) = (
            l.seqs as i32,
            l.max_drafts as i32,
            self.config.vocab_size as i32,
        );
        // SAFETY (every launch): argument order and types match kernels/sampling.cu and
        // kernels/acceptance.cu; every view was carved from buffers sized by `layout`.
        unsafe {
            stream
                .launch_builder(&k.argmax_rows)
                .arg(logits)
                .arg(&mut argmax)
                .arg(&v_i)
                .launch(rows_cfg(l.rows))
                .map_err(driver_err)?;
            stream
                .launch_builder(&k.greedy_accept)
                .arg(&mut argmax)
                .arg(&drafts_v)
                .arg(&num_v)
                .arg(&off_v)
                .arg(&mut g_tok)
                .arg(&mut g_acc)
                .arg(&n_i)
                .arg(&d_i)
                .launch(per_seq_cfg(l.seqs))
                .map_err(driver_err)?;
        }
        Ok(())
    }
}
