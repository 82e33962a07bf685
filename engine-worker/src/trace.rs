//! `--trace-acceptance PATH`: every step's rows as JSON Lines in the golden acceptance event
//! format (`../shared/spec/acceptance-metrics.md`, "Trace files"), readable by
//! `token-processor replay`. The first line identifies the run. The line types are
//! [`proto::trace`], which the replay reads with.
//!
//! Beyond the golden fields, each line carries what a what-if replay (`token-processor replay
//! --what-if`) re-scores with: the step number and its end time, a verify's whole offer from the
//! proposer and the tokens the step emitted, the verify forward's time; the header carries the
//! policy's cost curve.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use proto::trace::{Event, EventKind, Header, RequestName};
use proto::worker_tp::{CostPoint, VerifyTiming};

use crate::engine::{RowKind, RowOut};

pub struct TraceWriter {
    out: BufWriter<File>,
    started: Instant,
    steps: u64,
}

/// What identifies the run in the header.
pub struct TraceRun<'a> {
    pub num_spec_tokens: usize,
    pub model: &'a str,
    pub worker_id: &'a str,
    pub proposer: &'a str,
    /// The policy's verify-cost curve at start.
    pub verify_cost: &'a [CostPoint],
}

impl TraceWriter {
    /// Creates (truncates) the file and writes the header line.
    pub fn create(path: &Path, run: &TraceRun<'_>) -> std::io::Result<Self> {
        let header = Header {
            model: Some(run.model.to_owned()),
            num_spec_tokens: u32::try_from(run.num_spec_tokens).map_err(std::io::Error::other)?,
            proposer: Some(run.proposer.to_owned()),
            verify_cost: run
                .verify_cost
                .iter()
                .map(|p| (p.tokens, p.seconds))
                .collect(),
            worker_id: Some(run.worker_id.to_owned()),
        };
        let mut out = BufWriter::new(File::create(path)?);
        write_line(&mut out, &header)?;
        out.flush()?;
        Ok(Self {
            out,
            started: Instant::now(),
            steps: 0,
        })
    }

    /// Appends one event per row of a step and flushes, so a crash loses at most the current
    /// step.
    pub fn record(
        &mut self,
        rows: &[RowOut],
        verify_timing: Option<VerifyTiming>,
    ) -> std::io::Result<()> {
        let step = StepFacts {
            step: self.steps,
            t_us: self.started.elapsed().as_micros() as u64,
            verify_us: verify_timing.map(|t| t.micros),
        };
        self.steps += 1;
        for row in rows {
            write_line(&mut self.out, &event(row, &step))?;
        }
        self.out.flush()
    }
}

fn write_line(out: &mut impl Write, line: &impl serde::Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")
}

/// What every row of one step shares.
pub struct StepFacts {
    pub step: u64,
    pub t_us: u64,
    pub verify_us: Option<u32>,
}

/// A row as a golden event with the step's facts; request ids print as decimal strings.
pub fn event(row: &RowOut, step: &StepFacts) -> Event {
    let kind = match row.kind {
        RowKind::Prefill => EventKind::Prefill,
        RowKind::Verify => EventKind::Verify,
        RowKind::Preempted => EventKind::Preempted,
        RowKind::Abort => EventKind::Abort,
    };
    let verify = row.kind == RowKind::Verify;
    Event {
        accepted: verify.then_some(row.accepted),
        drafted: verify.then_some(row.drafted),
        finish: row.finish,
        offered: verify.then(|| row.policy.offer.clone()),
        request: RequestName::Text(row.id.to_string()),
        step: Some(step.step),
        t_us: Some(step.t_us),
        tokens: (!row.tokens.is_empty()).then(|| row.tokens.clone()),
        kind,
        verify_us: step.verify_us,
    }
}
