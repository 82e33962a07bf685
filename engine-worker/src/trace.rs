//! `--trace-acceptance PATH`: every step's rows as JSON Lines in the golden acceptance event
//! format (`../shared/spec/acceptance-metrics.md`, "Trace files"), readable by
//! `token-processor replay`. The first line identifies the run. The line types are
//! [`proto::trace`], which the replay reads with.
//!
//! Beyond the golden fields, each line carries what a what-if replay (`token-processor replay
//! --what-if`) re-scores with: the step number and its end time, a verify's whole offer from the
//! proposer and the tokens the step emitted, the verify forward's time; the header carries the
//! policy's cost curve.
//!
//! The file is the operator's, so it is made with care: never through a symlink, mode 0600
//! (request tokens are in it), at most `max_bytes` before it is rotated to `PATH.1` (one old
//! file kept, so the trace takes at most twice that), and written by its own thread: the step
//! loop hands each step's events to a bounded queue and never waits on the disk. A step that
//! finds the queue full is dropped from the trace and counted (a warning names how many).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Instant;

use proto::trace::{Event, EventKind, Header, RequestName};
use proto::worker_tp::{CostPoint, VerifyTiming};

use crate::engine::{RowKind, RowOut};

/// Steps the writer may fall behind by before steps are dropped from the trace.
pub const TRACE_QUEUE_STEPS: usize = 1024;

/// The default size at which the trace is rotated (`--trace-acceptance-max-mib`).
pub const DEFAULT_TRACE_MAX_MIB: u64 = 256;

pub struct TraceWriter {
    queue: Option<SyncSender<Vec<Event>>>,
    writer: Option<JoinHandle<std::io::Result<()>>>,
    started: Instant,
    steps: u64,
    /// Steps dropped because the queue was full.
    dropped: u64,
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
    /// Creates (truncates) the file, writes the header line and starts the writer thread.
    /// `max_bytes`: the size past which the file is rotated to `PATH.1`.
    pub fn create(path: &Path, run: &TraceRun<'_>, max_bytes: u64) -> std::io::Result<Self> {
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
        let file = TraceFile::create(path.to_owned(), header, max_bytes)?;
        Self::spawn(move |steps| file.write_all(steps))
    }

    /// Starts `write` on its own thread, fed each recorded step through the bounded queue.
    fn spawn(
        write: impl FnOnce(Receiver<Vec<Event>>) -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<Self> {
        let (queue, steps) = sync_channel(TRACE_QUEUE_STEPS);
        let writer = std::thread::Builder::new()
            .name("trace-writer".into())
            .spawn(move || write(steps))?;
        Ok(Self {
            queue: Some(queue),
            writer: Some(writer),
            started: Instant::now(),
            steps: 0,
            dropped: 0,
        })
    }

    /// Hands one event per row of a step to the writer thread; never blocks. An error means
    /// the writer has stopped (it could not write): tracing is over.
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
        let events = rows.iter().map(|row| event(row, &step)).collect();
        let queue = self.queue.as_ref().ok_or_else(writer_gone)?;
        match queue.try_send(events) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.dropped += 1;
                if self.dropped.is_power_of_two() {
                    tracing::warn!(
                        dropped_steps = self.dropped,
                        "the acceptance trace's writer is behind; steps dropped from the trace"
                    );
                }
                Ok(())
            }
            Err(TrySendError::Disconnected(_)) => {
                Err(self.finish().err().unwrap_or_else(writer_gone))
            }
        }
    }

    /// Steps dropped from the trace because the writer was behind.
    pub fn dropped_steps(&self) -> u64 {
        self.dropped
    }

    /// Stops the writer after it has written everything queued; its error, if it had one.
    pub fn finish(&mut self) -> std::io::Result<()> {
        self.queue = None;
        match self.writer.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(std::io::Error::other("the trace writer panicked")),
        }
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        if let Err(error) = self.finish() {
            tracing::error!(%error, "the acceptance trace's last steps were not written");
        }
    }
}

fn writer_gone() -> std::io::Error {
    std::io::Error::other("the trace writer has stopped")
}

/// The trace file on the writer thread: its size, and rotation past `max_bytes`.
struct TraceFile {
    path: PathBuf,
    header: Header,
    max_bytes: u64,
    out: BufWriter<File>,
    written: u64,
}

impl TraceFile {
    fn create(path: PathBuf, header: Header, max_bytes: u64) -> std::io::Result<Self> {
        let mut file = Self {
            out: BufWriter::new(open_private(&path)?),
            path,
            header,
            max_bytes,
            written: 0,
        };
        file.write_header()?;
        Ok(file)
    }

    fn write_header(&mut self) -> std::io::Result<()> {
        self.written += write_line(&mut self.out, &self.header)?;
        self.out.flush()
    }

    /// Writes every step the loop sends, flushing each, until the loop stops sending.
    fn write_all(mut self, steps: Receiver<Vec<Event>>) -> std::io::Result<()> {
        for events in steps {
            if self.written >= self.max_bytes {
                self.rotate()?;
            }
            for event in &events {
                self.written += write_line(&mut self.out, event)?;
            }
            // A crash loses at most the steps still queued.
            self.out.flush()?;
        }
        Ok(())
    }

    /// `PATH` becomes `PATH.1` (replacing an older one; a rename never follows a link) and a
    /// new `PATH` starts with the header.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.out = BufWriter::new(open_private(&self.path)?);
        self.written = 0;
        self.write_header()
    }
}

/// Opens `path` for writing, truncated, mode 0600, refusing a symlink (`O_NOFOLLOW`) or
/// anything but a regular file; an existing file's mode is narrowed to 0600.
fn open_private(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.set_len(0)?;
    Ok(file)
}

/// Writes one JSON line; its length in bytes.
fn write_line(out: &mut impl Write, line: &impl serde::Serialize) -> std::io::Result<u64> {
    let mut text = serde_json::to_vec(line)?;
    text.push(b'\n');
    out.write_all(&text)?;
    Ok(text.len() as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> TraceRun<'static> {
        TraceRun {
            num_spec_tokens: 4,
            model: "m",
            worker_id: "w",
            proposer: "ngram",
            verify_cost: &[],
        }
    }

    fn verify_row(id: u64) -> RowOut {
        RowOut {
            id,
            kind: RowKind::Verify,
            tokens: vec![1, 2, 3],
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            drafted: 4,
            accepted: 2,
            policy: Default::default(),
            finish: None,
            start: None,
        }
    }

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "specula-trace-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_file_is_private_and_never_made_through_a_symlink() {
        let dir = dir();
        let target = dir.join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.join("trace.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(TraceWriter::create(&link, &run(), 1 << 20).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");

        let path = dir.join("plain.jsonl");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut trace = TraceWriter::create(&path, &run(), 1 << 20).unwrap();
        trace.record(&[verify_row(1)], None).unwrap();
        trace.finish().unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().count(),
            2,
            "header and one event, the old text gone"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Past `max_bytes` the file moves to `PATH.1` and a new one starts with the header: the
    /// trace takes at most about twice the cap, and every file stands alone.
    #[test]
    fn the_trace_rotates_past_its_size_and_keeps_one_old_file() {
        let dir = dir();
        let path = dir.join("trace.jsonl");
        let max = 4096;
        let mut trace = TraceWriter::create(&path, &run(), max).unwrap();
        for step in 0..400u64 {
            trace
                .record(&[verify_row(step), verify_row(step + 1000)], None)
                .unwrap();
        }
        trace.finish().unwrap();
        let old = dir.join("trace.jsonl.1");
        let files: Vec<String> = [&path, &old]
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        let longest_step = files[1]
            .lines()
            .skip(1)
            .take(2)
            .map(|l| l.len() + 1)
            .sum::<usize>();
        for text in &files {
            assert!(
                text.len() <= max as usize + longest_step,
                "{} bytes",
                text.len()
            );
            let header: Header = serde_json::from_str(text.lines().next().unwrap()).unwrap();
            assert_eq!(header.num_spec_tokens, 4);
            let events: Vec<Event> = text
                .lines()
                .skip(1)
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert!(!events.is_empty());
        }
        // The newest steps are in PATH, in order.
        let last: Event = serde_json::from_str(files[0].lines().last().unwrap()).unwrap();
        assert_eq!(last.step, Some(399));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The step loop never waits for the disk: with the writer stuck, `record` returns at
    /// once; the steps past the queue are dropped and counted, the queued ones still written.
    #[test]
    fn a_stuck_writer_drops_steps_instead_of_blocking_the_loop() {
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let (written_tx, written) = std::sync::mpsc::channel();
        let mut trace = TraceWriter::spawn(move |steps| {
            stuck.recv().unwrap();
            written_tx.send(steps.iter().count()).unwrap();
            Ok(())
        })
        .unwrap();
        let steps = TRACE_QUEUE_STEPS + 100;
        for _ in 0..steps {
            trace.record(&[verify_row(1)], None).unwrap();
        }
        assert_eq!(trace.dropped_steps(), 100);
        release.send(()).unwrap();
        trace.finish().unwrap();
        assert_eq!(written.recv().unwrap(), TRACE_QUEUE_STEPS);
    }
}
