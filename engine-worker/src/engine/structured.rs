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
