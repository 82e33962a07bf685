//! Token choice and draft verification on the device: after the forward, argmax (greedy) or
//! speculative sampling picks each sequence's tokens, and only `accepted drafts + 1` token ids
//! and the accepted count per sequence are copied back, never the `[rows, vocab]` logits.
//!
//! A sequence verifies its [`SeqForward::drafts`] (its rows score the token after each of
//! `tokens[0..]`); one with only its last row's logits drafts nothing and gets one token
//! (prefill, plain decode).
//!
//! The engine reaches this through [`Backend::forward_and_verify`](crate::backend::Backend) for
//! greedy batches only: argmax over the same logits with the same tie rule is exactly the host's
//! choice. Sampling here takes its uniform draws from the caller, in f32 and without
//! top-k/top-p, so it cannot reproduce the host's seeded choices; sampled requests are decided
//! on the host.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::weights::{alloc, driver_err};
use super::CudaBackend;
use crate::backend::SeqForward;
use crate::spec::Verdict;
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

impl SeqSampling<'_> {
    fn is_sampled(&self) -> bool {
        self.temperature > 0.0
    }
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

/// Offsets (in `u32`s) of the verify step's arrays in its three buffers; `S` sequences, `D` the
/// most drafts of any, `R` logit rows.
///
/// - input: drafts `[S, D]` | num_drafts `[S]` | row_offset `[S]` | temps `[R]` (f32 bits) |
///   accept uniforms `[S, D]` (f32 bits) | final uniforms `[S]` (f32 bits);
/// - output: greedy tokens `[S, D+1]` | greedy accepted `[S]` | sampled tokens `[S, D+1]` |
///   sampled accepted `[S]`;
/// - scratch: argmax `[R]` | stats `[R, 2]` | final_row `[S]` | final_excluded `[S]` |
///   sampled `[S]`.
#[derive(Debug, Clone, Copy)]
struct VerifyLayout {
    seqs: usize,
    max_drafts: usize,
    rows: usize,
    i_num: usize,
    i_off: usize,
    i_temp: usize,
    i_uacc: usize,
    i_ufin: usize,
    in_len: usize,
    o_gacc: usize,
    o_stok: usize,
    o_sacc: usize,
    out_len: usize,
    s_stats: usize,
    s_frow: usize,
    s_fexc: usize,
    s_samp: usize,
    scratch_len: usize,
}

impl VerifyLayout {
    fn new(seqs: usize, max_drafts: usize, rows: usize) -> Self {
        let (i_num, i_off, i_temp) = (
            seqs * max_drafts,
            seqs * (max_drafts + 1),
            seqs * (max_drafts + 2),
        );
        let i_uacc = i_temp + rows;
        let i_ufin = i_uacc + seqs * max_drafts;
        let tok_len = seqs * (max_drafts + 1);
        Self {
            seqs,
            max_drafts,
            rows,
            i_num,
            i_off,
            i_temp,
            i_uacc,
            i_ufin,
            in_len: i_ufin + seqs,
            o_gacc: tok_len,
            o_stok: tok_len + seqs,
            o_sacc: 2 * tok_len + seqs,
            out_len: 2 * tok_len + 2 * seqs,
            s_stats: rows,
            s_frow: 3 * rows,
            s_fexc: 3 * rows + seqs,
            s_samp: 3 * rows + 2 * seqs,
            scratch_len: 3 * rows + 3 * seqs,
        }
    }

    /// The input buffer's contents for `seqs`.
    fn pack_inputs(
        &self,
        seqs: &[SeqForward<'_>],
        sampling: Option<&[SeqSampling<'_>]>,
    ) -> Vec<u32> {
        let mut input = vec![0u32; self.in_len];
        let mut row = 0usize;
        for (i, s) in seqs.iter().enumerate() {
            let drafts = s.drafts();
            let d = drafts.len();
            input[i * self.max_drafts..][..d].copy_from_slice(drafts);
            input[self.i_num + i] = d as u32;
            input[self.i_off + i] = row as u32;
            let p = sampling.map(|s| s[i]);
            let temp = p.map_or(0.0, |p| p.temperature);
            for r in 0..s.logit_rows() {
                input[self.i_temp + row + r] = if temp > 0.0 { temp } else { 1.0f32 }.to_bits();
            }
            if let Some(p) = p.filter(SeqSampling::is_sampled) {
                for j in 0..d {
                    input[self.i_uacc + i * self.max_drafts + j] = p.uniforms[j].to_bits();
                }
                input[self.i_ufin + i] = p.uniforms[d].to_bits();
            }
            row += s.logit_rows();
        }
        input
    }

    /// Each sequence's verdict from the copied-back output.
    fn verdicts(
        &self,
        out: &[u32],
        seqs: &[SeqForward<'_>],
        sampling: Option<&[SeqSampling<'_>]>,
    ) -> Vec<Verdict> {
        (0..self.seqs)
            .map(|i| {
                let sampled = sampling.is_some_and(|s| s[i].is_sampled());
                let (tok, acc) = if sampled {
                    (self.o_stok, self.o_sacc)
                } else {
                    (0, self.o_gacc)
                };
                let accepted = out[acc + i] as usize;
                let base = tok + i * (self.max_drafts + 1);
                Verdict {
                    drafted: seqs[i].drafts().len(),
                    accepted,
                    tokens: out[base..base + accepted + 1].to_vec(),
                }
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

/// `sampling` is `None` or one entry per sequence, each sampled one with a finite temperature
/// and a draw per draft plus one.
fn check_sampling(
    seqs: &[SeqForward<'_>],
    sampling: Option<&[SeqSampling<'_>]>,
) -> Result<(), EngineError> {
    let Some(sampling) = sampling else {
        return Ok(());
    };
    if sampling.len() != seqs.len() {
        return Err(EngineError::InvalidBatch(format!(
            "{} sampling entries for {} sequences",
            sampling.len(),
            seqs.len()
        )));
    }
    for (i, (p, s)) in sampling.iter().zip(seqs).enumerate() {
        let d = s.drafts().len();
        if p.is_sampled() && (!p.temperature.is_finite() || p.uniforms.len() < d + 1) {
            return Err(EngineError::InvalidBatch(format!(
                "sequence {i}: sampling needs a finite temperature and {} uniforms",
                d + 1
            )));
        }
    }
    Ok(())
}

impl CudaBackend {
    /// Forward plus on-device verification. `sampling` is `None` for all-greedy, or one entry
    /// per sequence.
    pub fn verify_on_device(
        &mut self,
        seqs: &[SeqForward<'_>],
        sampling: Option<&[SeqSampling<'_>]>,
    ) -> Result<Vec<Verdict>, EngineError> {
        check_sampling(seqs, sampling)?;
        let started = std::time::Instant::now();
        let rows = self.forward_on_device(seqs)?.rows;
        if self.profiling {
            self.stream.synchronize().map_err(driver_err)?;
        }
        let forward_done = std::time::Instant::now();
        let max_drafts = seqs.iter().map(|s| s.drafts().len()).max().unwrap_or(0);
        let layout = VerifyLayout::new(seqs.len(), max_drafts.max(1), rows);
        let sampled_any = sampling.is_some_and(|s| s.iter().any(SeqSampling::is_sampled));
        self.upload_verify_inputs(&layout, &layout.pack_inputs(seqs, sampling))?;
        self.launch_greedy(&layout)?;
        if sampled_any {
            self.launch_sampled(&layout)?;
        }
        if self.profiling {
            self.stream.synchronize().map_err(driver_err)?;
        }
        let sampling_done = std::time::Instant::now();
        let copy_len = if sampled_any {
            layout.out_len
        } else {
            layout.o_stok
        };
        let out = self
            .stream
            .clone_dtoh(&self.verify_ws.output.slice(0..copy_len))
            .map_err(driver_err)?;
        self.stream.synchronize().map_err(driver_err)?;
        if self.profiling {
            self.last_timings = Some(StepTimings {
                forward_s: (forward_done - started).as_secs_f64(),
                sampling_s: (sampling_done - forward_done).as_secs_f64(),
                transfer_s: sampling_done.elapsed().as_secs_f64(),
            });
        }
        Ok(layout.verdicts(&out, seqs, sampling))
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
            (&mut vw.scratch, layout.scratch_len),
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
        let off_v = inp.slice(l.i_off..l.i_temp);
        let (mut g_tok, mut rest) = vw.output.split_at_mut(l.o_gacc);
        let (mut g_acc, _) = rest.split_at_mut(l.o_stok - l.o_gacc);
        let (mut argmax, _) = vw.scratch.split_at_mut(l.s_stats);
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

    /// Speculative sampling with the caller's draws: acceptance tests, then the final token.
    fn launch_sampled(&mut self, layout: &VerifyLayout) -> Result<(), EngineError> {
        let l = layout;
        let (stream, k, logits) = (&self.stream, &self.kernels, &self.workspace.logits);
        let vw = &mut self.verify_ws;
        let inp = &vw.input;
        let drafts_v = inp.slice(0..l.i_num);
        let num_v = inp.slice(l.i_num..l.i_off);
        let off_v = inp.slice(l.i_off..l.i_temp);
        let temp_v = inp.slice(l.i_temp..l.i_uacc);
        let uacc_v = inp.slice(l.i_uacc..l.i_ufin);
        let ufin_v = inp.slice(l.i_ufin..l.in_len);
        let (_, mut out_s) = vw.output.split_at_mut(l.o_stok);
        let (mut s_tok, mut s_acc) = out_s.split_at_mut(l.o_sacc - l.o_stok);
        let (_, mut rest) = vw.scratch.split_at_mut(l.s_stats);
        let (mut stats, mut rest) = rest.split_at_mut(l.s_frow - l.s_stats);
        let (mut frow, mut rest) = rest.split_at_mut(l.s_fexc - l.s_frow);
        let (mut fexc, mut samp) = rest.split_at_mut(l.s_samp - l.s_fexc);
        let (n_i, d_i, v_i) = (
            l.seqs as i32,
            l.max_drafts as i32,
            self.config.vocab_size as i32,
        );
        // SAFETY (every launch): argument order and types match kernels/sampling.cu and
        // kernels/acceptance.cu; every view was carved from buffers sized by `layout`.
        unsafe {
            stream
                .launch_builder(&k.softmax_stats)
                .arg(logits)
                .arg(&temp_v)
                .arg(&mut stats)
                .arg(&v_i)
                .launch(rows_cfg(l.rows))
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
                .launch(per_seq_cfg(l.seqs))
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
                .launch(rows_cfg(l.seqs))
                .map_err(driver_err)?;
            stream
                .launch_builder(&k.finish_sampled)
                .arg(&mut samp)
                .arg(&mut s_acc)
                .arg(&mut s_tok)
                .arg(&n_i)
                .arg(&d_i)
                .launch(per_seq_cfg(l.seqs))
                .map_err(driver_err)?;
        }
        Ok(())
    }
}
