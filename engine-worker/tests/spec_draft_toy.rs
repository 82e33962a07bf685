//! Model drafters on the toy model: a draft model (its own cache, laid out like the target's)
//! and self-speculation (the target's first layers, in the target's cache). Both toy caches
//! re-derive a hash chain over the whole prefix on every read, so a draft that trusted a stale or
//! foreign slot fails its request instead of drafting quietly worse. Greedy and seeded outputs
//! must equal K = 0's at batch 1, 8 and 16, with preemption and prefix-cache hits; acceptance by
//! position must tell a good draft from a bad one.

mod common;

use std::collections::HashMap;

use common::*;
use engine_worker::engine::{Engine, EngineConfig};
use engine_worker::spec::{DraftSource, ModelDrafter, StepCost};
use proto::api_worker::SamplingParams;
use proto::FinishReason;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const VOCAB: usize = 48;
const BLOCK: usize = 4;

/// Prompts from three stems with random tails, so later requests hit cached prefixes.
fn prompts(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let stems: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            let len = rng.gen_range(2..30);
            (0..len).map(|_| rng.gen_range(1..VOCAB as u32)).collect()
        })
        .collect();
    (0..n)
        .map(|_| {
            let mut p = stems[rng.gen_range(0..stems.len())].clone();
            let tail = rng.gen_range(0..10);
            p.extend((0..tail).map(|_| rng.gen_range(1..VOCAB as u32)));
            p
        })
        .collect()
}

/// Which drafter a run uses.
#[derive(Clone, Copy, Debug)]
enum Drafter {
    /// The configured lookup proposer (n-gram).
    Lookup,
    /// A draft model `noise` away from the toy.
    Model(f32),
    /// The target's first N layers.
    Layers(usize),
}

struct Run {
    outcomes: Vec<Outcome>,
    preemptions: usize,
    hit_tokens: u64,
}

/// Runs `reqs` in waves of `wave` (later waves find earlier prompts cached) to completion.
fn run(
    cfg: EngineConfig,
    drafter: Drafter,
    num_blocks: usize,
    reqs: &[(Vec<u32>, u32, SamplingParams)],
    wave: usize,
) -> Run {
    let target = ToyBackend::new(VOCAB, vec![0], num_blocks, BLOCK);
    let source = match drafter {
        Drafter::Lookup => None,
        Drafter::Model(noise) => Some(DraftSource::Model(Box::new(target.draft(noise, 99)))),
        Drafter::Layers(n) => Some(DraftSource::TargetLayers(n)),
    };
    let mut engine = Engine::with_drafter(target, cfg, None, source).expect("engine");
    let mut outcomes = HashMap::new();
    for (w, chunk) in reqs.chunks(wave).enumerate() {
        for (i, (prompt, max_tokens, sampling)) in chunk.iter().enumerate() {
            let id = (w * wave + i) as u64;
            engine
                .add_request(request(id, prompt.clone(), *max_tokens, sampling.clone()))
                .unwrap();
        }
        run_to_completion(&mut engine, &mut outcomes);
    }
    if let Some(d) = engine.drafter() {
        assert_eq!(
            d.tracked(),
            0,
            "every finished sequence's draft state is dropped"
        );
    }
    let outcomes: Vec<Outcome> = (0..reqs.len() as u64)
        .map(|i| outcomes[&i].clone())
        .collect();
    for (i, o) in outcomes.iter().enumerate() {
        assert_ne!(
            o.finish,
            Some(FinishReason::Error),
            "request {i} failed: {o:?}"
        );
    }
    Run {
        preemptions: outcomes.iter().map(|o| o.preemptions).sum(),
        hit_tokens: engine.scheduler().prefix_stats().hit_tokens,
        outcomes,
    }
}

fn reqs(n: usize, seed: u64, sampling: &SamplingParams) -> Vec<(Vec<u32>, u32, SamplingParams)> {
    prompts(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut s = sampling.clone();
            if s.seed.is_some() {
                s.seed = Some(1000 + i as u64);
            }
            (p, 40, s)
        })
        .collect()
}

fn sampled() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(1),
        ..SamplingParams::GREEDY
    }
}

/// The same tokens as K = 0 for every request, from every drafter, at batch 1, 8 and 16.
fn check_lossless(sampling: SamplingParams) {
    let reqs = reqs(24, 3, &sampling);
    let plain = run(engine_config(0, 8), Drafter::Lookup, 4096, &reqs, 8);
    for drafter in [
        Drafter::Model(0.0),
        Drafter::Model(0.3),
        Drafter::Model(1.0),
        Drafter::Layers(1),
        Drafter::Layers(4),
    ] {
        for batch in [1, 8, 16] {
            let spec = run(engine_config(4, batch), drafter, 4096, &reqs, 8);
            for i in 0..reqs.len() {
                assert_eq!(
                    spec.outcomes[i].tokens, plain.outcomes[i].tokens,
                    "{drafter:?} at batch {batch}: request {i}"
                );
            }
            assert!(
                spec.hit_tokens > 0,
                "later waves should hit cached prefixes"
            );
            let drafted: usize = spec
                .outcomes
                .iter()
                .flat_map(|o| &o.steps)
                .map(|s| s.0 as usize)
                .sum();
            assert!(drafted > 0, "{drafter:?} at batch {batch} never drafted");
        }
    }
}

#[test]
fn greedy_output_equals_k0_with_draft_models_and_early_exit() {
    check_lossless(SamplingParams::GREEDY);
}

#[test]
fn seeded_sampling_equals_k0_with_draft_models_and_early_exit() {
    check_lossless(sampled());
}

/// A cache small enough to preempt and evict: sequences lose their blocks, get others (or the
/// same ids after another sequence wrote them) and resume; the draft must notice.
#[test]
fn preemption_and_eviction_keep_outputs_exact_and_draft_caches_sound() {
    for sampling in [SamplingParams::GREEDY, sampled()] {
        let reqs = reqs(16, 11, &sampling);
        let plain = run(engine_config(0, 16), Drafter::Lookup, 4096, &reqs, 16);
        for drafter in [Drafter::Model(0.2), Drafter::Layers(3)] {
            let tight = run(engine_config(4, 16), drafter, 48, &reqs, 16);
            assert!(
                tight.preemptions > 0,
                "{drafter:?}: the tight cache should preempt"
            );
            for i in 0..reqs.len() {
                assert_eq!(
                    tight.outcomes[i].tokens, plain.outcomes[i].tokens,
                    "{drafter:?}, preempted: request {i}"
                );
            }
        }
    }
}

/// Acceptance per draft position: the toy model drafting for itself accepts every draft, a draft
/// near it accepts most with acceptance falling by position, a draft of another model almost
/// nothing.
#[test]
fn per_head_acceptance_tells_a_good_draft_from_a_bad_one() {
    let reqs = reqs(16, 5, &SamplingParams::GREEDY);
    let heads = |noise: f32| -> (Vec<f64>, usize, usize) {
        let r = run(engine_config(4, 8), Drafter::Model(noise), 4096, &reqs, 16);
        let mut reached = [0usize; 4];
        let mut accepted = [0usize; 4];
        let (mut drafted, mut total_accepted) = (0, 0);
        for &(d, a) in r.outcomes.iter().flat_map(|o| &o.steps) {
            drafted += d as usize;
            total_accepted += a as usize;
            if d > 0 {
                reached[0] += 1;
            }
            for count in accepted.iter_mut().take(a as usize) {
                *count += 1;
            }
        }
        let steps = reached[0].max(1) as f64;
        (
            accepted.iter().map(|&a| a as f64 / steps).collect(),
            drafted,
            total_accepted,
        )
    };
    let (same, drafted, accepted) = heads(0.0);
    assert_eq!(
        drafted, accepted,
        "the target drafting for itself: {same:?}"
    );
    let (good, _, _) = heads(0.03);
    let (bad, _, _) = heads(1.0);
    assert!(good[0] > 0.5, "good draft head 1: {good:?}");
    assert!(bad[0] < 0.2, "bad draft head 1: {bad:?}");
    assert!(
        good.windows(2).all(|w| w[1] <= w[0]),
        "acceptance by position never rises"
    );
}

/// Under the goodput policy a bad draft is soon left unused: it drafts far less than under the
/// fixed policy, and its output stays exact.
#[test]
fn the_goodput_policy_stops_drafting_with_a_bad_draft() {
    let reqs = reqs(16, 8, &SamplingParams::GREEDY);
    let plain = run(engine_config(0, 4), Drafter::Lookup, 4096, &reqs, 16);
    let mut goodput_cfg = engine_config(4, 4);
    goodput_cfg.spec_policy = SpecPolicy::Goodput;
    let drafted = |r: &Run| -> usize {
        r.outcomes
            .iter()
            .flat_map(|o| &o.steps)
            .map(|s| s.0 as usize)
            .sum()
    };
    let fixed = run(engine_config(4, 4), Drafter::Model(1.0), 4096, &reqs, 16);
    let goodput = run(goodput_cfg, Drafter::Model(1.0), 4096, &reqs, 16);
    for i in 0..reqs.len() {
        assert_eq!(
            goodput.outcomes[i].tokens, plain.outcomes[i].tokens,
            "request {i}"
        );
    }
    assert!(
        drafted(&goodput) * 4 < drafted(&fixed),
        "goodput drafted {} of the bad draft's tokens, fixed {}",
        drafted(&goodput),
        drafted(&fixed)
    );
}

#[test]
fn a_draft_that_does_not_fit_the_target_is_refused() {
    let target = ToyBackend::new(VOCAB, vec![0], 64, BLOCK);
    let other_vocab = ToyBackend::new(VOCAB + 1, vec![0], 64, BLOCK);
    let err = ModelDrafter::new(
        engine_worker::spec::ModelSource::Model(Box::new(other_vocab)),
        &target,
        StepCost::from_calibration(&[], 1),
    )
    .expect_err("vocabulary sizes differ");
    assert!(err.to_string().contains("49 tokens"), "{err}");
    let other_layout = ToyBackend::new(VOCAB, vec![0], 64, BLOCK * 2);
    assert!(ModelDrafter::new(
        engine_worker::spec::ModelSource::Model(Box::new(other_layout)),
        &target,
        StepCost::from_calibration(&[], 1),
    )
    .is_err());
    for layers in [0, 8, 9] {
        assert!(
            ModelDrafter::new(
                engine_worker::spec::ModelSource::TargetLayers(layers),
                &target,
                StepCost::from_calibration(&[], 1)
            )
            .is_err(),
            "{layers} layers of 8"
        );
    }
}

#[test]
fn the_drafter_names_itself() {
    let cfg = engine_config(4, 4);
    let target = ToyBackend::new(VOCAB, vec![0], 256, BLOCK);
    let draft = target.draft(0.1, 1);
    let e = Engine::with_drafter(
        target,
        cfg.clone(),
        None,
        Some(DraftSource::Model(Box::new(draft))),
    )
    .unwrap();
    assert_eq!(e.proposer_name(), "draft:toy-draft-0.1");
    let target = ToyBackend::new(VOCAB, vec![0], 256, BLOCK);
    let e = Engine::with_drafter(target, cfg, None, Some(DraftSource::TargetLayers(3))).unwrap();
    assert_eq!(e.proposer_name(), "layers:3");
    assert_eq!(e.draft_kv_bytes(), 0);
}
