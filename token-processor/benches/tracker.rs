//! The tracker's cost per step batch, in process: `Ingest::handle` on a decoded batch, decode
//! alone, and decode + handle on the wire frame (what the live ingest does per frame); and the
//! forwarder's encoding of one batch's outputs. Synthetic batches with 64/256/512 rows and
//! K = 4 and 8 (`token_processor::synth`).

use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use proto::tp_api::TpToApi;
use proto::worker_tp::{Resync, WorkerHello, WorkerToTp};
use token_processor::ingest::{Ingest, IngestConfig};
use token_processor::synth::{Synth, SynthConfig};
use token_processor::tracker::{Clock, Outbox};

fn setup(rows: usize, k: u8) -> (Ingest, Synth) {
    let worker_id = format!("bench-{rows}-{k}");
    let mut ingest = Ingest::new(IngestConfig::default());
    let mut out = Outbox::default();
    let now = Clock {
        mono_ns: 0,
        unix_ms: 0,
    };
    let hello = WorkerHello {
        protocol_version: proto::PROTOCOL_VERSION,
        worker_id: worker_id.clone(),
        epoch: 1,
        model: "bench".into(),
        num_spec_tokens: u32::from(k),
        proposer: "synthetic".into(),
        ready: true,
        heartbeat_interval_ms: 0,
        max_model_len: 2048,
        kv_capacity_tokens: 32_768,
        kv_bytes: 0,
        draft_kv_bytes: 0,
        max_num_seqs: 16,
        session: 7,
    };
    ingest.handle(WorkerToTp::Hello(hello), now, Instant::now(), &mut out);
    let resync = Resync {
        worker_id: worker_id.clone(),
        epoch: 1,
        next_seq: 0,
        requests: vec![],
    };
    ingest.handle(WorkerToTp::Resync(resync), now, Instant::now(), &mut out);
    let synth = Synth::new(SynthConfig {
        worker_id,
        epoch: 1,
        rows,
        num_spec_tokens: k,
        min_len: 16,
        max_len: 512,
        accept_p: 0.7,
        owner: "bench-api".into(),
        seed: 42,
    });
    (ingest, synth)
}

fn bench_tracker(c: &mut Criterion) {
    let mut group = c.benchmark_group("step_batch");
    for k in [4u8, 8] {
        for rows in [64usize, 256, 512] {
            group.throughput(Throughput::Elements(rows as u64));
            let (mut ingest, mut synth) = setup(rows, k);
            let mut tick = 0u64;
            group.bench_function(BenchmarkId::new(format!("handle/k{k}"), rows), |b| {
                b.iter_batched(
                    || WorkerToTp::Step(synth.next_batch()),
                    |msg| {
                        tick += 1;
                        let mut out = Outbox::default();
                        let now = Clock {
                            mono_ns: tick * 1_000_000,
                            unix_ms: tick,
                        };
                        ingest.handle(msg, now, Instant::now(), &mut out);
                        out
                    },
                    BatchSize::SmallInput,
                )
            });
            let (_, mut synth) = setup(rows, k);
            group.bench_function(BenchmarkId::new(format!("decode/k{k}"), rows), |b| {
                b.iter_batched(
                    || proto::encode(&WorkerToTp::Step(synth.next_batch())).unwrap(),
                    |frame| proto::decode::<WorkerToTp>(&frame).unwrap(),
                    BatchSize::SmallInput,
                )
            });
            let (mut ingest, mut synth) = setup(rows, k);
            group.bench_function(
                BenchmarkId::new(format!("decode_and_handle/k{k}"), rows),
                |b| {
                    b.iter_batched(
                        || proto::encode(&WorkerToTp::Step(synth.next_batch())).unwrap(),
                        |frame| {
                            tick += 1;
                            let mut out = Outbox::default();
                            let now = Clock {
                                mono_ns: tick * 1_000_000,
                                unix_ms: tick,
                            };
                            let msg: WorkerToTp = proto::decode(&frame).unwrap();
                            ingest.handle(msg, now, Instant::now(), &mut out);
                            out
                        },
                        BatchSize::SmallInput,
                    )
                },
            );
        }
    }
    group.finish();
}

/// The forwarder's encoding of one owner's outputs of a 512-row K=8 batch: the direct writer it
/// uses, and rmp-serde on the materialized `TpToApi::Outputs` it replaced (same bytes).
fn bench_encode_outputs(c: &mut Criterion) {
    let (mut ingest, mut synth) = setup(512, 8);
    let mut out = Outbox::default();
    for tick in 1..=50u64 {
        let now = Clock {
            mono_ns: tick * 1_000_000,
            unix_ms: tick,
        };
        out = Outbox::default();
        ingest.handle(
            WorkerToTp::Step(synth.next_batch()),
            now,
            Instant::now(),
            &mut out,
        );
    }
    let (_, list) = out.take().pop().expect("outputs for the bench api-server");
    let materialized = list.to_outputs();
    let mut group = c.benchmark_group("encode_outputs_512");
    group.bench_function("direct", |b| {
        b.iter(|| token_processor::tracker::encode_outputs_message(&list).unwrap())
    });
    group.bench_function("rmp_serde", |b| {
        b.iter_batched(
            || materialized.clone(),
            |outputs| proto::encode(&TpToApi::Outputs(outputs)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_tracker, bench_encode_outputs);
criterion_main!(benches);
