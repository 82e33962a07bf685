//! One representative value of every message kind, shared by the wire tests.

use proto::api_worker::*;
use proto::tp_api::*;
use proto::worker_tp::*;
use proto::{FinishReason, SpeculateMetrics, TokenLogprob, PROTOCOL_VERSION};

pub fn worker_hello() -> WorkerHello {
    WorkerHello {
        protocol_version: PROTOCOL_VERSION,
        worker_id: "worker-0".into(),
        epoch: 1_764_460_000_123,
        model: "SmolLM2-135M-Instruct".into(),
        num_spec_tokens: 4,
        proposer: "ngram".into(),
        ready: true,
        heartbeat_interval_ms: 500,
        max_model_len: 2048,
        kv_capacity_tokens: 32_768,
        kv_bytes: 1_509_949_440,
        draft_kv_bytes: 6_291_456,
        max_num_seqs: 16,
        session: 7,
    }
}

pub fn api_hello() -> ApiHello {
    ApiHello {
        protocol_version: PROTOCOL_VERSION,
        api_server_id: "api-a".into(),
        epoch: 77,
    }
}

pub fn heartbeat() -> Heartbeat {
    Heartbeat {
        worker_id: "worker-0".into(),
        epoch: 1_764_460_000_123,
        next_seq: 42,
        running: 3,
        waiting: 1,
        accepting: true,
        retained: 2,
        retained_bytes: 96,
        retained_evicted: 0,
        tp_acked_seq: 40,
        tp_link_up: true,
        kv_blocks: proto::worker_tp::KvBlocks {
            used: 12,
            cached: 30,
            free: 2006,
        },
        verify_cost: vec![
            proto::worker_tp::CostPoint {
                tokens: 1,
                seconds: 0.006,
            },
            proto::worker_tp::CostPoint {
                tokens: 8,
                seconds: 0.0165,
            },
        ],
    }
}

pub fn step_batch() -> StepBatch {
    // Row 0 is a prefill of a 12-token prompt that asked for prompt logprobs: 11 of them.
    let prompt_logprobs: Vec<TokenLogprob> = (1..=11)
        .map(|i| TokenLogprob {
            logprob: -(i as f32) / 8.0,
            top: vec![(100 + i, -0.0625)],
        })
        .collect();
    let mut b = StepBatch::new("worker-0".into(), 1_764_460_000_123, 41);
    b.push(StepRow {
        id: 7,
        tokens: &[504],
        drafted: 0,
        accepted: 0,
        offered: 0,
        predicted_milli: 0,
        prefill: true,
        preempted: false,
        finish: None,
        logprobs: &[],
        prompt_logprobs: &prompt_logprobs,
    });
    b.starts.push(RequestStart {
        row: 0,
        owner: "api-a".into(),
        prompt_tokens: 12,
        cached_prompt_tokens: 0,
        arrival_unix_ms: 1_764_460_000_000,
        class: "code".into(),
    });
    b.push(StepRow {
        id: 9,
        tokens: &[3575, 282, 4649],
        drafted: 4,
        accepted: 2,
        offered: 4,
        predicted_milli: 1750,
        prefill: false,
        preempted: false,
        finish: None,
        logprobs: &[
            TokenLogprob {
                logprob: -0.125,
                top: vec![(3575, -0.125), (30, -2.5)],
            },
            TokenLogprob {
                logprob: -1.5,
                top: vec![(9, -0.75), (282, -1.5)],
            },
            TokenLogprob {
                logprob: f32::NEG_INFINITY,
                top: vec![(1, 0.0), (2, f32::NEG_INFINITY)],
            },
        ],
        prompt_logprobs: &[],
    });
    b.push(StepRow {
        id: 11,
        tokens: &[],
        drafted: 0,
        accepted: 0,
        offered: 0,
        predicted_milli: 0,
        prefill: false,
        preempted: true,
        finish: None,
        logprobs: &[],
        prompt_logprobs: &[],
    });
    b.push(StepRow {
        id: 12,
        tokens: &[2],
        drafted: 3,
        accepted: 0,
        offered: 4,
        predicted_milli: 1200,
        prefill: false,
        preempted: false,
        finish: Some(FinishReason::Stop),
        logprobs: &[],
        prompt_logprobs: &[],
    });
    b.verify_timing = Some(proto::worker_tp::VerifyTiming {
        micros: 21_500,
        k0_tokens_milli: 2_870,
    });
    b
}

pub fn resync() -> Resync {
    Resync {
        worker_id: "worker-0".into(),
        epoch: 1_764_460_000_123,
        next_seq: 42,
        requests: vec![ResyncRequest {
            id: 9,
            owner: "api-a".into(),
            prompt_tokens: 30,
            cached_prompt_tokens: 16,
            arrival_unix_ms: 1_764_460_000_001,
            prefilled: true,
            tokens: vec![1, 2, 3, 4, 5, 6],
            drafted: vec![4, 0],
            accepted: vec![3, 0],
            offered: vec![4, 2],
            predicted_milli: vec![2_400, 0],
            class: "chat".into(),
            finish: 0,
            logprobs: (1..=6)
                .map(|i| TokenLogprob {
                    logprob: -(i as f32) / 4.0,
                    top: vec![(i, -0.5)],
                })
                .collect(),
            prompt_logprobs: (1..30)
                .map(|i| TokenLogprob {
                    logprob: -(i as f32) / 16.0,
                    top: Vec::new(),
                })
                .collect(),
        }],
    }
}

pub fn add_request() -> AddRequest {
    AddRequest {
        id: (0xABCDEF << 40) | 5,
        prompt_token_ids: vec![1, 9690, 198],
        sampling: SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            seed: Some(1234),
            processors: proto::api_worker::LogitsProcessors {
                presence_penalty: 0.5,
                frequency_penalty: -0.25,
                repetition_penalty: 1.1,
                min_p: 0.05,
                min_tokens: 4,
                logit_bias: vec![(504, -100.0), (7, 2.5)],
                bad_words: vec![vec![12, 345], vec![678]],
            },
            logprobs: Some(5),
            prompt_logprobs: Some(1),
            structured: Some(proto::api_worker::StructuredOutput::JsonSchema(
                r#"{"type": "object", "required": ["name"]}"#.into(),
            )),
        },
        stop: StopConditions {
            stop_token_ids: vec![2],
            ignore_eos: false,
            stop_strings: vec!["\n\n".into()],
        },
        max_tokens: 64,
        arrival_unix_ms: 1_764_460_000_000,
        owner: "api-a".into(),
        class: "extraction".into(),
    }
}

pub fn speculate_metrics() -> SpeculateMetrics {
    SpeculateMetrics {
        accepted_tokens: 17,
        rejected_tokens: 9,
        accept_ratio: 9.0 / 17.0,
        average_accept_length: 2.125,
        accept_ratio_per_head: vec![2.0 / 3.0, 0.75, 0.5, 1.0],
        accepted_tokens_per_head: vec![8, 4, 3, 1, 1],
        num_steps: 8,
        num_drafts: 6,
        num_draft_tokens: 18,
        num_accepted_draft_tokens: 9,
        draft_acceptance_rate: 0.5,
        accept_length_histogram: vec![4, 1, 2, 0, 1],
        draft_length_histogram: vec![2, 1, 1, 1, 3],
        num_offered_tokens: Some(26),
        predicted_accepted_tokens: Some(8.5),
    }
}

pub fn outputs() -> Vec<RequestOutput> {
    vec![
        RequestOutput {
            id: 9,
            first_index: 3,
            tokens: vec![3575, 282],
            finish: None,
            usage: None,
            speculate_metrics: None,
            error: None,
            logprobs: vec![
                TokenLogprob {
                    logprob: -0.125,
                    top: vec![],
                },
                TokenLogprob {
                    logprob: -3.0,
                    top: vec![],
                },
            ],
            prompt_logprobs: Vec::new(),
        },
        RequestOutput {
            id: 12,
            first_index: 20,
            tokens: vec![2],
            finish: Some(FinishReason::Stop),
            usage: Some(TokenCounts {
                prompt_tokens: 12,
                cached_prompt_tokens: 0,
                completion_tokens: 21,
            }),
            speculate_metrics: Some(Box::new(speculate_metrics())),
            error: None,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        },
        RequestOutput {
            id: 13,
            first_index: 0,
            tokens: vec![],
            finish: Some(FinishReason::Error),
            usage: Some(TokenCounts {
                prompt_tokens: 5,
                cached_prompt_tokens: 0,
                completion_tokens: 0,
            }),
            speculate_metrics: None,
            error: Some(OutputError {
                kind: OutputErrorKind::WorkerLost,
                message: "worker worker-0 missed its heartbeats".into(),
            }),
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        },
        RequestOutput {
            id: 14,
            first_index: 0,
            tokens: vec![30],
            finish: None,
            usage: None,
            speculate_metrics: None,
            error: None,
            logprobs: Vec::new(),
            prompt_logprobs: vec![
                TokenLogprob {
                    logprob: -4.25,
                    top: vec![(17, -0.5)],
                },
                TokenLogprob {
                    logprob: -0.5,
                    top: vec![(30, -0.5)],
                },
            ],
        },
    ]
}

/// Every message kind of every link, with the name of its frozen fixture.
pub fn all_frames() -> Vec<(&'static str, Vec<u8>)> {
    let enc = |v: &dyn erased::Enc| v.enc();
    vec![
        ("api_to_worker_hello", enc(&ApiToWorker::Hello(api_hello()))),
        ("api_to_worker_add", enc(&ApiToWorker::Add(add_request()))),
        (
            "api_to_worker_abort",
            enc(&ApiToWorker::Abort(Abort { id: 5 })),
        ),
        (
            "api_to_worker_heartbeat",
            enc(&ApiToWorker::Heartbeat {
                api_server_id: "api-a".into(),
                epoch: 77,
            }),
        ),
        (
            "worker_to_api_hello",
            enc(&WorkerToApi::Hello(worker_hello())),
        ),
        (
            "worker_to_api_heartbeat",
            enc(&WorkerToApi::Heartbeat(heartbeat())),
        ),
        (
            "worker_to_api_rejected",
            enc(&WorkerToApi::Rejected {
                id: 5,
                reason: RejectReason::Invalid("too long".into()),
            }),
        ),
        (
            "worker_to_tp_hello",
            enc(&WorkerToTp::Hello(worker_hello())),
        ),
        ("worker_to_tp_step", enc(&WorkerToTp::Step(step_batch()))),
        (
            "worker_to_tp_heartbeat",
            enc(&WorkerToTp::Heartbeat(heartbeat())),
        ),
        ("worker_to_tp_resync", enc(&WorkerToTp::Resync(resync()))),
        (
            "worker_to_tp_goodbye",
            enc(&WorkerToTp::Goodbye {
                worker_id: "worker-0".into(),
                epoch: 3,
            }),
        ),
        ("api_to_tp_hello", enc(&ApiToTp::Hello(api_hello()))),
        (
            "api_to_tp_heartbeat",
            enc(&ApiToTp::Heartbeat {
                api_server_id: "api-a".into(),
                epoch: 77,
            }),
        ),
        (
            "tp_to_api_hello",
            enc(&TpToApi::Hello(TpHello {
                protocol_version: PROTOCOL_VERSION,
                epoch: 5,
                workers: vec!["worker-0".into(), "worker-1".into()],
            })),
        ),
        ("tp_to_api_outputs", enc(&TpToApi::Outputs(outputs()))),
        ("tp_to_api_ask_hello", enc(&TpToApi::AskHello)),
        ("worker_to_api_ask_hello", enc(&WorkerToApi::AskHello)),
        (
            "api_to_worker_probe",
            enc(&ApiToWorker::Probe {
                ids: vec![7, u64::MAX],
            }),
        ),
        (
            "api_to_worker_delivered",
            enc(&ApiToWorker::Delivered {
                ids: vec![7, u64::MAX],
            }),
        ),
        (
            "worker_to_api_not_held",
            enc(&WorkerToApi::NotHeld { ids: vec![7] }),
        ),
        (
            "tp_to_worker_ack",
            enc(&TpToWorker::Ack {
                epoch: 1_764_460_000_123,
                next_seq: 42,
            }),
        ),
        ("tp_to_worker_ask_hello", enc(&TpToWorker::AskHello)),
        (
            "tp_to_worker_refused",
            enc(&TpToWorker::Refused {
                reason: "worker id worker-0 is held by another live worker".into(),
            }),
        ),
        (
            "tp_to_api_refused",
            enc(&TpToApi::Refused {
                reason: "api-server id api-a is held by another live api-server".into(),
            }),
        ),
    ]
}

mod erased {
    pub trait Enc {
        fn enc(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Enc for T {
        fn enc(&self) -> Vec<u8> {
            proto::encode(self).unwrap()
        }
    }
}
