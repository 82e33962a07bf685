//! Structured output in the step loop: each constrained sequence's grammar masks its rows, at
//! draft positions too (the state after each draft, [`Grammar::draft_masks`]), and moves past
//! the tokens the verifier emits. Lookup drafts the grammar rules out are dropped before the
//! forward (they could not be accepted), and a sequence with no lookup drafts drafts the text
//! the grammar forces (`{"name": "` after `{`), which the target accepts whenever it spells it
//! the same way.

use grammar::{Compiler, Constraint, Grammar, Mask};
use proto::api_worker::StructuredOutput;
use vocab::TokenBytes;

use crate::scheduler::{Sequence, SequencePhase};

/// The worker's grammar compiler, when the model has a vocabulary to compile over.
pub fn compiler(vocab: Option<&TokenBytes>, vocab_size: usize, eos: &[u32]) -> Option<Compiler> {
    let (vocab, &eos) = (vocab?, eos.first()?);
    match Compiler::new(vocab, vocab_size, eos) {
        Ok(compiler) => Some(compiler),
        Err(error) => {
            tracing::warn!(%error, "structured output is off: the vocabulary cannot be indexed");
            None
        }
    }
}

/// A request's grammar compiled off the step loop: the api link starts the compile as the
/// request arrives ([`GrammarJob::start`], on the blocking pool) and hands the job to the
/// engine with the request, in order with its other commands (an abort that follows finds the
/// request queued). The sequence waits in the queue until its grammar is ready, so the step
/// loop never compiles.
/// Where a [`GrammarJob`]'s compile sends its result.
pub type GrammarDone = std::sync::mpsc::SyncSender<Result<Grammar, String>>;

#[derive(Debug)]
pub struct GrammarJob(std::sync::mpsc::Receiver<Result<Grammar, String>>);

impl GrammarJob {
    /// Compiles `structured` on tokio's blocking pool (call from the runtime).
    pub fn start(compiler: Compiler, structured: StructuredOutput) -> Self {
        let (done, job) = Self::pending();
        tokio::task::spawn_blocking(move || {
            let _ = done.send(compile(Some(&compiler), &structured));
        });
        job
    }

    /// A job whose result whoever holds the sender gives (the compile thread; tests).
    pub fn pending() -> (GrammarDone, Self) {
        let (done, job) = std::sync::mpsc::sync_channel(1);
        (done, Self(job))
    }

    /// The compiled grammar or why not, once done; None while it compiles.
    pub fn poll(&self) -> Option<Result<Grammar, String>> {
        match self.0.try_recv() {
            Ok(done) => Some(done),
            Err(std::sync::mpsc::TryRecvError::Empty) => None,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                Some(Err("the grammar compile did not finish".into()))
            }
        }
    }
}

/// A request's grammar at the start of its output, or why it cannot have one.
pub fn compile(
    compiler: Option<&Compiler>,
    structured: &StructuredOutput,
) -> Result<Grammar, String> {
    let compiler = compiler.ok_or("structured output needs the model's vocabulary")?;
    let constraint = match structured {
        StructuredOutput::JsonObject => Constraint::JsonObject,
        StructuredOutput::JsonSchema(schema) => Constraint::JsonSchema(schema.clone()),
    };
    compiler
        .compile(&constraint)
        .map_err(|e| format!("response_format: {e}"))
}

/// Per running sequence, the masks of its rows this step (empty without a grammar). With
/// `lookup` drafts, those the grammar rules out are dropped first and forced text is drafted
/// where nothing was, up to `max_drafts` of the sequence.
pub fn step_masks(
    running: &mut [Sequence],
    planned: &mut [(Vec<u32>, usize)],
    lookup: bool,
    max_drafts: &[usize],
) -> Vec<Vec<Mask>> {
    running
        .iter_mut()
        .zip(planned.iter_mut())
        .zip(max_drafts)
        .map(|((seq, (drafts, _)), &max)| {
            let verifying = seq.phase() != SequencePhase::Prefill;
            let eos = seq.stop_ids.first().copied().unwrap_or(0);
            let Some(grammar) = seq.grammar.as_deref_mut() else {
                return Vec::new();
            };
            if lookup && drafts.is_empty() && verifying {
                *drafts = grammar.forced();
                drafts.truncate(max);
            }
            match grammar.draft_masks(drafts) {
                Ok(masks) => {
                    if lookup {
                        drafts.truncate(masks.len() - 1);
                    }
                    masks
                }
                Err(error) => {
                    // Not expected (every consumed token was one its mask allowed); the
                    // request ends at EOS rather than run unconstrained.
                    tracing::warn!(%error, "grammar failed; ending the output");
                    drafts.clear();
                    vec![Mask::only(eos)]
                }
            }
        })
        .collect()
}

/// Moves a sequence's grammar past the tokens it just emitted.
pub fn advance(seq: &mut Sequence, emitted: &[u32]) {
    if let Some(grammar) = seq.grammar.as_deref_mut() {
        if let Err(error) = grammar.accept(emitted) {
            tracing::warn!(%error, "grammar failed to accept emitted tokens");
        }
    }
}
