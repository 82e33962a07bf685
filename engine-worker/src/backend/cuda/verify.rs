//! Token choice and draft verification on the device: after the forward, argmax (greedy) or
//! speculative sampling picks each sequence's tokens, and only `accepted drafts + 1` token ids
//! and the accepted count per sequence are copied back, never the `[rows, vocab]` logits.
//!
//! A sequence with [`LogitsFor::All`] verifies `tokens[1..]` as its drafts (its rows score the
//! token after each of `tokens[0..]`); one with [`LogitsFor::Last`] drafts nothing and gets one
//! token (prefill, plain decode).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::batch::MetaLayout;
use super::weights::{alloc, driver_err};
use super::CudaBackend;
use crate::backend::{LogitsFor, SeqForward};
use crate::EngineError;

/// How one sequence picks its tokens.
#[derive(Debug, Clone, Copy)]
pub struct SeqSampling<'a> {
    /// 0 for greedy; otherwise softmax temperature (no top-k/top-p on the device).
    pub temperature: f32,
    /// Uniform draws in `[0, 1)`: one per draft (acceptance tests), then one for the final
    /// token. Unused when greedy.
    pub uniforms: &'a [f32],
}

/// What one sequence got from a verify step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyOutcome {
    /// The accepted drafts followed by the target model's own token: `accepted + 1` tokens.
    pub tokens: Vec<u32>,
    pub drafted: usize,
    pub accepted: usize,
}

/// Where a verify step's time went, measured when profiling is on (see
/// [`CudaBackend::set_profiling`]): the stream is synchronised between phases, so the phases
/// add up to the step but the step is a little slower than unprofiled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimings {
    /// Host preparation, upload and the forward's kernels and GEMMs.
    pub forward_s: f64,
    /// Argmax / sampling / acceptance kernels.
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
    /// Forward plus on-device verification. `sampling` is `None` for all-greedy, or one entry
    /// per sequence.
    pub fn verify(
        &mut self,
        seqs: &[SeqForward<'_>],
        sampling: Option<&[SeqSampling<'_>]>,
    ) -> Result<Vec<VerifyOutcome>, EngineError> {
        if let Some(s) = sampling {
            if s.len() != seqs.len() {
                return Err(EngineError::InvalidBatch(format!(
                    "{} sampling entries for {} sequences",
                    s.len(),
                    seqs.len()
                )));
            }
        }
        let n_seqs = seqs.len();
        let drafted: Vec<usize> = seqs
            .iter()
            .map(|s| match s.logits {
                LogitsFor::All => s.tokens.len().saturating_sub(1),
                LogitsFor::Last => 0,
            })
            .collect();
        let sampled_any = sampling.is_some_and(|s| s.iter().any(|p| p.temperature > 0.0));
        if let Some(s) = sampling {
            for (i, (p, &d)) in s.iter().zip(&drafted).enumerate() {
                if p.temperature > 0.0 && (!p.temperature.is_finite() || p.uniforms.len() < d + 1) {
                    return Err(EngineError::InvalidBatch(format!(
                        "sequence {i}: sampling needs a finite temperature and {} uniforms",
                        d + 1
                    )));
                }
            }
        }
        let started = std::time::Instant::now();
        let layout: MetaLayout = self.forward_on_device(seqs)?;
        if self.profiling {
            self.stream.synchronize().map_err(driver_err)?;
        }
        let forward_done = std::time::Instant::now();
        let rows = layout.rows;
        let max_drafts = drafted.iter().copied().max().unwrap_or(0).max(1);
        let vocab = self.config.vocab_size;

        // Inputs: drafts [S, D] | num_drafts [S] | row_offset [S] | temps [R] (f32 bits) |
        // accept uniforms [S, D] (f32 bits) | final uniforms [S] (f32 bits).
        let (i_drafts, i_num, i_off, i_temp) = (
            0,
            n_seqs * max_drafts,
            n_seqs * (max_drafts + 1),
            n_seqs * (max_drafts + 2),
        );
        let i_uacc = i_temp + rows;
        let i_ufin = i_uacc + n_seqs * max_drafts;
        let in_len = i_ufin + n_seqs;
        let mut input = vec![0u32; in_len];
        let mut row = 0usize;
        for (i, s) in seqs.iter().enumerate() {
            let d = drafted[i];
            input[i_drafts + i * max_drafts..][..d].copy_from_slice(&s.tokens[1..1 + d]);
            input[i_num + i] = d as u32;
            input[i_off + i] = row as u32;
            let p = sampling.map(|s| s[i]);
            let temp = p.map_or(0.0, |p| p.temperature);
            for r in 0..s.logit_rows() {
                input[i_temp + row + r] = if temp > 0.0 { temp } else { 1.0f32 }.to_bits();
            }
            if let Some(p) = p.filter(|p| p.temperature > 0.0) {
                for j in 0..d {
                    input[i_uacc + i * max_drafts + j] = p.uniforms[j].to_bits();
                }
                input[i_ufin + i] = p.uniforms[d].to_bits();
            }
            row += s.logit_rows();
        }
        // Outputs: greedy tokens [S, D+1] | greedy accepted [S] | sampled tokens [S, D+1] |
        // sampled accepted [S].
        let tok_len = n_seqs * (max_drafts + 1);
        let (o_gtok, o_gacc, o_stok, o_sacc) = (0, tok_len, tok_len + n_seqs, 2 * tok_len + n_seqs);
        let out_len = 2 * tok_len + 2 * n_seqs;
        // Scratch: argmax [R] | stats [R, 2] | final_row [S] | final_excluded [S] | sampled [S].
        let (s_arg, s_stats, s_frow, s_fexc, s_samp) =
            (0, rows, 3 * rows, 3 * rows + n_seqs, 3 * rows + 2 * n_seqs);
        let scratch_len = 3 * rows + 3 * n_seqs;

        let stream = self.stream.clone();
        let vw = &mut self.verify_ws;
        for (buf, len) in [
            (&mut vw.input, in_len),
            (&mut vw.output, out_len),
            (&mut vw.scratch, scratch_len),
        ] {
            if buf.len() < len {
                *buf = alloc(&stream, len * 2)?;
            }
        }
        stream
            .memcpy_htod(&input, &mut vw.input.slice_mut(0..in_len))
            .map_err(driver_err)?;

        let k = &self.kernels;
        let logits = &self.workspace.logits;
        let inp = &vw.input;
        let drafts_v = inp.slice(i_drafts..i_num);
        let num_v = inp.slice(i_num..i_off);
        let off_v = inp.slice(i_off..i_temp);
        let temp_v = inp.slice(i_temp..i_uacc);
        let uacc_v = inp.slice(i_uacc..i_ufin);
        let ufin_v = inp.slice(i_ufin..in_len);
        let (mut out_g, mut out_s) = {
            let (g, s) = vw.output.split_at_mut(o_stok);
            (g, s)
        };
        let (mut g_tok, mut g_acc) = out_g.split_at_mut(o_gacc);
        let (mut s_tok, mut s_acc) = out_s.split_at_mut(o_sacc - o_stok);
        let (mut argmax, mut rest) = vw.scratch.split_at_mut(s_stats);
        let (mut stats, mut rest) = rest.split_at_mut(s_frow - s_stats);
        let (mut frow, mut rest) = rest.split_at_mut(s_fexc - s_frow);
        let (mut fexc, mut samp) = rest.split_at_mut(s_samp - s_fexc);
        let _ = (s_arg, o_gtok);
        let (n_i, d_i, v_i) = (n_seqs as i32, max_drafts as i32, vocab as i32);

        // SAFETY (every launch): argument order and types match kernels/sampling.cu and
        // kernels/acceptance.cu; every view was carved above with the sizes the kernels index.
        unsafe {
            stream
                .launch_builder(&k.argmax_rows)
                .arg(logits)
                .arg(&mut argmax)
                .arg(&v_i)
                .launch(rows_cfg(rows))
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
                .launch(per_seq_cfg(n_seqs))
                .map_err(driver_err)?;
            if sampled_any {
                stream
                    .launch_builder(&k.softmax_stats)
                    .arg(logits)
                    .arg(&temp_v)
                    .arg(&mut stats)
                    .arg(&v_i)
                    .launch(rows_cfg(rows))
                    .map_err(driver_err)?;
                stream
                    .launch_builder(&k.sampled_accept)
                    .arg(logits)
                    .arg(&mut stats)
                    .arg(&temp_v)
                    .arg(&drafts_v)
                    .arg(&num_v)
                    .arg(&off_v)
                    .arg(&uacc_v)
                    .arg(&mut s_tok)
                    .arg(&mut s_acc)
                    .arg(&mut frow)
                    .arg(&mut fexc)
                    .arg(&n_i)
                    .arg(&d_i)
                    .arg(&v_i)
                    .launch(per_seq_cfg(n_seqs))
                    .map_err(driver_err)?;
                stream
                    .launch_builder(&k.sample_rows)
                    .arg(logits)
                    .arg(&mut frow)
                    .arg(&temp_v)
                    .arg(&ufin_v)
                    .arg(&mut fexc)
                    .arg(&mut samp)
                    .arg(&v_i)
                    .launch(rows_cfg(n_seqs))
                    .map_err(driver_err)?;
                stream
                    .launch_builder(&k.finish_sampled)
                    .arg(&mut samp)
                    .arg(&mut s_acc)
                    .arg(&mut s_tok)
                    .arg(&n_i)
                    .arg(&d_i)
                    .launch(per_seq_cfg(n_seqs))
                    .map_err(driver_err)?;
            }
        }
        if self.profiling {
            stream.synchronize().map_err(driver_err)?;
        }
        let sampling_done = std::time::Instant::now();
        let copy_len = if sampled_any { out_len } else { o_stok };
        let out = stream
            .clone_dtoh(&vw.output.slice(0..copy_len))
            .map_err(driver_err)?;
        stream.synchronize().map_err(driver_err)?;
        if self.profiling {
            self.last_timings = Some(StepTimings {
                forward_s: (forward_done - started).as_secs_f64(),
                sampling_s: (sampling_done - forward_done).as_secs_f64(),
                transfer_s: sampling_done.elapsed().as_secs_f64(),
            });
        }

        Ok((0..n_seqs)
            .map(|i| {
                let sampled = sampling.is_some_and(|s| s[i].temperature > 0.0);
                let (tok, acc) = if sampled {
                    (o_stok, o_sacc)
                } else {
                    (o_gtok, o_gacc)
                };
                let accepted = out[acc + i] as usize;
                let base = tok + i * (max_drafts + 1);
                VerifyOutcome {
                    tokens: out[base..base + accepted + 1].to_vec(),
                    drafted: drafted[i],
                    accepted,
                }
            })
            .collect())
    }
}
