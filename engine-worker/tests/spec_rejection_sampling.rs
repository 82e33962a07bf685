//! Speculative sampling leaves the output distribution equal to the target model's: on the toy
//! model at temperature 1, the joint distribution of the first three output tokens with n-gram
//! drafting (K=4) is compared with the exact target probabilities by a chi-square test.

mod common;

use std::collections::HashMap;

use common::*;
use engine_worker::engine::Engine;
use engine_worker::sampling::Distribution;
use proto::api_worker::SamplingParams;

const VOCAB: usize = 5;
const SAMPLES: u64 = 12_000;

#[test]
fn speculative_sampling_matches_the_target_distribution() {
    let params = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        seed: Some(seed),
        processors: proto::api_worker::LogitsProcessors::NONE,
        logprobs: None,
        prompt_logprobs: None,
        structured: None,
    };
    // A repetitive prompt so the n-gram proposer drafts on every step.
    let prompt = vec![1, 2, 3, 1, 2, 3, 1, 2];
    let sharpness = 3.0;
    let mut backend = ToyBackend::new(VOCAB, vec![], 2048, 4);
    backend.sharpness = sharpness;
    let mut engine = Engine::new(backend, engine_config(4, 64), None);
    let mut outcomes = HashMap::new();
    for id in 0..SAMPLES {
        engine
            .add_request(request(id, prompt.clone(), 6, params(id)))
            .unwrap();
    }
    run_to_completion(&mut engine, &mut outcomes);
    let drafted: usize = outcomes
        .values()
        .flat_map(|o| &o.steps)
        .map(|s| s.0 as usize)
        .sum();
    let accepted: usize = outcomes
        .values()
        .flat_map(|o| &o.steps)
        .map(|s| s.1 as usize)
        .sum();
    assert!(
        drafted > 10_000 && accepted > 2_000,
        "drafting must be exercised: {drafted} {accepted}"
    );

    // Exact target probability of each 3-token continuation.
    let p = params(0);
    let dist =
        |prev: u32, cur: u32| Distribution::new(&toy_logits(VOCAB, sharpness, Some(prev), cur), &p);
    let mut expected = HashMap::new();
    let d1 = dist(1, 2);
    for &(a, pa) in d1.support() {
        let d2 = dist(2, a);
        for &(b, pb) in d2.support() {
            for &(c, pc) in dist(a, b).support() {
                expected.insert([a, b, c], pa * pb * pc * SAMPLES as f64);
            }
        }
    }
    let mut observed: HashMap<[u32; 3], f64> = HashMap::new();
    for o in outcomes.values() {
        *observed
            .entry([o.tokens[0], o.tokens[1], o.tokens[2]])
            .or_default() += 1.0;
    }
    // Pool cells expected below 5 so the chi-square approximation holds.
    let (mut chi2, mut cells, mut pooled_e, mut pooled_o) = (0.0, 0usize, 0.0, 0.0);
    for (key, &e) in &expected {
        let o = observed.get(key).copied().unwrap_or(0.0);
        if e < 5.0 {
            pooled_e += e;
            pooled_o += o;
        } else {
            chi2 += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_e > 0.0 {
        chi2 += (pooled_o - pooled_e).powi(2) / pooled_e;
        cells += 1;
    }
    let df = (cells - 1) as f64;
    // Upper 0.1% point of chi-square (Wilson-Hilferty): a fixed seed, so this is deterministic;
    // a biased verifier (e.g. accepting drafts outright) lands far above it.
    let z = 3.09;
    let t = 2.0 / (9.0 * df);
    let critical = df * (1.0 - t + z * t.sqrt()).powi(3);
    assert!(chi2 < critical, "chi2 {chi2:.1} >= {critical:.1} (df {df})");
}
