//! `--trace-acceptance PATH`: every step's rows as JSON Lines in the golden acceptance event
//! format (`../shared/spec/acceptance-metrics.md`, "Trace files"), readable by
//! `token-processor replay`. The first line identifies the run.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{json, Value};

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
        let mut out = BufWriter::new(File::create(path)?);
        let header = json!({
            "num_spec_tokens": num_spec_tokens,
            "model": model,
            "worker_id": worker_id,
            "proposer": proposer,
        });
        writeln!(out, "{header}")?;
        out.flush()?;
        Ok(Self { out })
    }

    /// Appends one event per row and flushes, so a crash loses at most the current step.
    pub fn record(&mut self, rows: &[RowOut]) -> std::io::Result<()> {
        for row in rows {
            writeln!(self.out, "{}", event(row))?;
        }
        self.out.flush()
    }
}

/// A row as a golden event; request ids print as decimal strings.
pub fn event(row: &RowOut) -> Value {
    let mut ev = serde_json::Map::new();
    let kind = match row.kind {
        RowKind::Prefill => "prefill",
        RowKind::Verify => "verify",
        RowKind::Preempted => "preempted",
        RowKind::Abort => "abort",
    };
    ev.insert("type".into(), kind.into());
    ev.insert("request".into(), row.id.to_string().into());
    if row.kind == RowKind::Verify {
        ev.insert("drafted".into(), row.drafted.into());
        ev.insert("accepted".into(), row.accepted.into());
    }
    if let Some(finish) = row.finish {
        ev.insert("finish".into(), finish.as_str().into());
    }
    Value::Object(ev)
}
