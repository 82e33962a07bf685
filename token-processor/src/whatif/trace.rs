//! A worker's JSON Lines trace read for re-scoring: per request its output and its verify
//! steps (position, offer), per step its rows and verify time.

use std::collections::{BTreeMap, HashMap};

use proto::trace::{Event, EventKind, Header};

use crate::error::TpError;

/// One recorded verify step of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyStep {
    /// Output tokens emitted before the step (the drafts predict `output[position..]`).
    pub position: usize,
    /// The proposer's whole offer.
    pub offer: Vec<u32>,
    pub drafted: u8,
    pub accepted: u8,
}

/// One request's output and verify steps, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestSteps {
    pub output: Vec<u32>,
    pub steps: Vec<VerifyStep>,
    /// Tokens the prefill emitted (1, or 0 if the trace began after it).
    pub prefill_tokens: usize,
}

/// One worker step: its verify rows and, when every row verified, its forward's time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepFacts {
    pub verify_rows: u32,
    /// Draft tokens its rows verified.
    pub drafted: u32,
    pub rows: u32,
    pub verify_us: Option<u32>,
    pub t_us: u64,
}

/// A trace as `--what-if` needs it.
#[derive(Debug, Clone, Default)]
pub struct WhatIfTrace {
    pub num_spec_tokens: u32,
    pub proposer: Option<String>,
    pub model: Option<String>,
    /// `(tokens, seconds)` of the worker's cost curve, tokens ascending.
    pub verify_cost: Vec<(u32, f64)>,
    pub requests: Vec<RequestSteps>,
    pub steps: BTreeMap<u64, StepFacts>,
}

impl WhatIfTrace {
    pub fn load(path: &std::path::Path) -> Result<Self, TpError> {
        Self::parse(&crate::replay::read_trace(path)?)
    }

    /// A worker's JSON Lines trace with the what-if fields (`step`, `offered`, `tokens`, and
    /// `verify_cost` in the header); a trace without them is refused, naming what is missing.
    pub fn parse(text: &str) -> Result<Self, TpError> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let (_, header) = lines.next().ok_or_else(|| parse_error(1, "empty trace"))?;
        let header: Header =
            serde_json::from_str(header).map_err(|e| parse_error(1, &format!("header: {e}")))?;
        crate::replay::check_num_spec_tokens(header.num_spec_tokens)?;
        if header.verify_cost.len() < 2 {
            return Err(parse_error(
                1,
                "the header has no verify_cost curve: record the trace with this version's --trace-acceptance",
            ));
        }
        let mut trace = Self {
            num_spec_tokens: header.num_spec_tokens,
            proposer: header.proposer,
            model: header.model,
            verify_cost: header.verify_cost,
            ..Self::default()
        };
        let mut index: HashMap<String, usize> = HashMap::new();
        for (i, line) in lines {
            let event: Event =
                serde_json::from_str(line).map_err(|e| parse_error(i + 1, &e.to_string()))?;
            trace.add(event, &mut index, i + 1)?;
        }
        Ok(trace)
    }

    fn add(
        &mut self,
        event: Event,
        index: &mut HashMap<String, usize>,
        line: usize,
    ) -> Result<(), TpError> {
        let step = event
            .step
            .ok_or_else(|| parse_error(line, "event without a step number"))?;
        let facts = self.steps.entry(step).or_default();
        facts.rows += 1;
        facts.verify_us = event.verify_us.or(facts.verify_us);
        facts.t_us = facts.t_us.max(event.t_us.unwrap_or(0));
        let name = event.request.into_string();
        let next = self.requests.len();
        let r = *index.entry(name).or_insert(next);
        if r == next {
            self.requests.push(RequestSteps::default());
        }
        let request = &mut self.requests[r];
        let tokens = event.tokens.unwrap_or_default();
        match event.kind {
            EventKind::Prefill => request.prefill_tokens = tokens.len(),
            EventKind::Verify => {
                facts.verify_rows += 1;
                facts.drafted += u32::from(event.drafted.unwrap_or(0));
                let (Some(drafted), Some(accepted)) = (event.drafted, event.accepted) else {
                    return Err(parse_error(line, "verify without drafted and accepted"));
                };
                let offer = event.offered.ok_or_else(|| {
                    parse_error(line, "verify without its offer (an older trace?)")
                })?;
                if accepted > drafted
                    || usize::from(drafted) > offer.len()
                    || u32::from(drafted) > self.num_spec_tokens
                {
                    return Err(parse_error(line, "need accepted <= drafted <= offered, K"));
                }
                request.steps.push(VerifyStep {
                    position: request.output.len(),
                    offer,
                    drafted,
                    accepted,
                });
            }
            EventKind::Preempted | EventKind::Abort => {}
        }
        request.output.extend_from_slice(&tokens);
        Ok(())
    }
}

fn parse_error(line: usize, message: &str) -> TpError {
    TpError::TraceParse {
        line,
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_positions_and_steps_are_rebuilt() {
        let text = r#"{"num_spec_tokens":2,"verify_cost":[[1,0.01],[4,0.02]]}
{"request":"1","step":0,"t_us":10,"tokens":[5],"type":"prefill"}
{"accepted":1,"drafted":2,"offered":[6,9],"request":"1","step":1,"t_us":20,"tokens":[6,7],"type":"verify","verify_us":900}
{"accepted":0,"drafted":0,"offered":[],"request":"1","step":2,"t_us":30,"tokens":[8],"type":"verify","finish":"length"}
"#;
        let t = WhatIfTrace::parse(text).unwrap();
        assert_eq!(t.requests.len(), 1);
        let r = &t.requests[0];
        assert_eq!(r.output, [5, 6, 7, 8]);
        assert_eq!(r.prefill_tokens, 1);
        assert_eq!(
            r.steps.iter().map(|s| s.position).collect::<Vec<_>>(),
            [1, 3]
        );
        assert_eq!(t.steps[&1].verify_us, Some(900));
        assert_eq!(t.steps[&1].verify_rows, 1);
        assert_eq!(t.steps[&0].verify_rows, 0);
    }

    #[test]
    fn a_trace_without_the_what_if_fields_is_refused() {
        let old = "{\"num_spec_tokens\":2}\n{\"request\":\"1\",\"type\":\"prefill\"}\n";
        assert!(WhatIfTrace::parse(old).is_err());
        let no_offer = r#"{"num_spec_tokens":2,"verify_cost":[[1,0.01],[4,0.02]]}
{"accepted":0,"drafted":1,"request":"1","step":1,"tokens":[6],"type":"verify"}
"#;
        let err = WhatIfTrace::parse(no_offer).unwrap_err().to_string();
        assert!(err.contains("offer"), "{err}");
    }

    /// A crafted header's K is bounded as plain replay bounds it; before, a 4-line trace with
    /// K near 2^32 sized the per-head tables by it and exhausted memory.
    #[test]
    fn a_crafted_k_is_refused_naming_the_bound() {
        let crafted = r#"{"num_spec_tokens":4000000000,"verify_cost":[[1,0.01],[4,0.02]]}
{"request":"1","step":0,"t_us":10,"tokens":[5],"type":"prefill"}
{"accepted":1,"drafted":1,"offered":[6],"request":"1","step":1,"t_us":20,"tokens":[6,7],"type":"verify","verify_us":900}
{"accepted":0,"drafted":0,"offered":[],"request":"1","step":2,"t_us":30,"tokens":[8],"type":"verify","finish":"length"}
"#;
        let err = WhatIfTrace::parse(crafted).unwrap_err().to_string();
        assert!(err.contains("num_spec_tokens 4000000000 exceeds"), "{err}");
    }
}
