//! `--trace-acceptance PATH`: every step's rows as JSON Lines in the golden acceptance event
//! format (`../shared/spec/acceptance-metrics.md`, "Trace files"), readable by
//! `token-processor replay`. The first line identifies the run. The line types are
//! [`proto::trace`], which the replay reads with.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use proto::trace::{Event, EventKind, Header, RequestName};

use crate::engine::{RowKind, RowOut};

pub struct TraceWriter {
    out: BufWriter<File>,
}

impl TraceWriter {
    /// Creates (truncates) the file and writes the header line.
    pub fn create(
        path: &Path,
        num_spec_tokens: usize,
        model: &str,
        worker_id: &str,
        proposer: &str,
    ) -> std::io::Result<Self> {
        let header = Header {
            model: Some(model.to_owned()),
            num_spec_tokens: u32::try_from(num_spec_tokens).map_err(std::io::Error::other)?,
            proposer: Some(proposer.to_owned()),
            worker_id: Some(worker_id.to_owned()),
        };
        let mut out = BufWriter::new(File::create(path)?);
        write_line(&mut out, &header)?;
        out.flush()?;
        Ok(Self { out })
    }

    /// Appends one event per row and flushes, so a crash loses at most the current step.
    pub fn record(&mut self, rows: &[RowOut]) -> std::io::Result<()> {
        for row in rows {
            write_line(&mut self.out, &event(row))?;
        }
        self.out.flush()
    }
}

fn write_line(out: &mut impl Write, line: &impl serde::Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, line)?;
    out.write_all(b"\n")
}

/// A row as a golden event; request ids print as decimal strings.
pub fn event(row: &RowOut) -> Event {
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
        request: RequestName::Text(row.id.to_string()),
        kind,
    }
}
