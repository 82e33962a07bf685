//! Round trips, frozen byte fixtures, and version checks for every message kind.

mod samples;

use proto::api_worker::{ApiToWorker, WorkerToApi};
use proto::tp_api::{ApiToTp, TpToApi};
use proto::worker_tp::{TpToWorker, WorkerToTp};
use proto::{check_version, decode, encode, ProtoError, PROTOCOL_VERSION};
use std::path::PathBuf;

fn roundtrip<T>(msg: T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = encode(&msg).unwrap();
    let back: T = decode(&bytes).unwrap();
    assert_eq!(back, msg);
}

#[test]
fn every_message_round_trips() {
    use proto::api_worker::*;
    use proto::tp_api::*;
    roundtrip(ApiToWorker::Hello(samples::api_hello()));
    roundtrip(ApiToWorker::Add(samples::add_request()));
    roundtrip(ApiToWorker::Abort(Abort { id: u64::MAX }));
    roundtrip(ApiToWorker::Heartbeat {
        api_server_id: "a".into(),
        epoch: 1,
    });
    roundtrip(WorkerToApi::Hello(samples::worker_hello()));
    roundtrip(WorkerToApi::Heartbeat(samples::heartbeat()));
    roundtrip(WorkerToApi::Rejected {
        id: 1,
        reason: RejectReason::Overloaded,
    });
    roundtrip(WorkerToApi::Rejected {
        id: 1,
        reason: RejectReason::NotAccepting,
    });
    roundtrip(WorkerToTp::Hello(samples::worker_hello()));
    roundtrip(WorkerToTp::Step(samples::step_batch()));
    roundtrip(WorkerToTp::Heartbeat(samples::heartbeat()));
    roundtrip(WorkerToTp::Resync(samples::resync()));
    roundtrip(WorkerToTp::Goodbye {
        worker_id: "w".into(),
        epoch: 9,
    });
    roundtrip(ApiToTp::Hello(samples::api_hello()));
    roundtrip(ApiToTp::Heartbeat {
        api_server_id: "a".into(),
        epoch: 2,
    });
    roundtrip(TpToApi::Hello(TpHello {
        protocol_version: PROTOCOL_VERSION,
        epoch: 1,
        workers: vec!["worker-0".into()],
    }));
    roundtrip(TpToApi::AskHello);
    roundtrip(WorkerToApi::AskHello);
    roundtrip(TpToApi::Refused {
        reason: "taken".into(),
    });
    roundtrip(WorkerToApi::Refused {
        reason: "taken".into(),
    });
    roundtrip(ApiToWorker::Probe { ids: vec![1, 2] });
    roundtrip(ApiToWorker::Delivered { ids: vec![3] });
    roundtrip(WorkerToApi::NotHeld { ids: vec![2] });
    roundtrip(TpToApi::Outputs(samples::outputs()));
    roundtrip(TpToWorker::Ack {
        epoch: 3,
        next_seq: u64::MAX,
    });
    roundtrip(TpToWorker::AskHello);
    roundtrip(TpToWorker::Refused {
        reason: "taken".into(),
    });
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// An accidental change to any message's encoding fails here. After an intended change, bump
/// `PROTOCOL_VERSION` and rewrite the fixtures with `SPECULA_BLESS_FIXTURES=1`.
#[test]
fn encodings_match_frozen_fixtures() {
    let bless = std::env::var_os("SPECULA_BLESS_FIXTURES").is_some();
    for (name, bytes) in samples::all_frames() {
        let path = fixture_dir().join(format!("{name}.msgpack"));
        if bless {
            std::fs::write(&path, &bytes).unwrap();
            continue;
        }
        let frozen = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("missing fixture {}: {e}", path.display()));
        assert_eq!(
            bytes, frozen,
            "encoding of {name} changed (protocol v{PROTOCOL_VERSION})"
        );
    }
}

/// The fixtures decode as the message kind they were made from, and only as that.
#[test]
fn fixtures_decode_to_their_link_type() {
    for (name, _) in samples::all_frames() {
        let frozen = std::fs::read(fixture_dir().join(format!("{name}.msgpack"))).unwrap();
        let ok = match name
            .split('_')
            .take(3)
            .collect::<Vec<_>>()
            .join("_")
            .as_str()
        {
            "api_to_worker" => decode::<ApiToWorker>(&frozen).is_ok(),
            "worker_to_api" => decode::<WorkerToApi>(&frozen).is_ok(),
            "worker_to_tp" => decode::<WorkerToTp>(&frozen).is_ok(),
            "api_to_tp" => decode::<ApiToTp>(&frozen).is_ok(),
            "tp_to_api" => decode::<TpToApi>(&frozen).is_ok(),
            "tp_to_worker" => decode::<TpToWorker>(&frozen).is_ok(),
            other => panic!("unknown link {other}"),
        };
        assert!(ok, "fixture {name} does not decode");
    }
}

#[test]
fn version_mismatch_names_both_versions() {
    assert!(check_version("worker-0", PROTOCOL_VERSION).is_ok());
    let err = check_version("worker-0", PROTOCOL_VERSION + 6).unwrap_err();
    assert!(matches!(err, ProtoError::VersionMismatch { .. }));
    let msg = err.to_string();
    assert!(msg.contains(&format!("v{}", PROTOCOL_VERSION + 6)), "{msg}");
    assert!(msg.contains(&format!("v{PROTOCOL_VERSION}")), "{msg}");
    assert!(msg.contains("worker-0"), "{msg}");
}

#[test]
fn oversized_truncated_and_trailing_frames_are_typed_errors() {
    let big = vec![0u8; proto::MAX_FRAME_BYTES + 1];
    assert!(matches!(
        decode::<WorkerToTp>(&big),
        Err(ProtoError::FrameTooLarge { .. })
    ));
    let frame = encode(&WorkerToTp::Step(samples::step_batch())).unwrap();
    for cut in 0..frame.len() {
        assert!(
            decode::<WorkerToTp>(&frame[..cut]).is_err(),
            "prefix {cut} decoded"
        );
    }
    let mut long = frame.clone();
    long.push(0xc0);
    assert!(matches!(
        decode::<WorkerToTp>(&long),
        Err(ProtoError::TrailingBytes { trailing: 1 })
    ));
}

#[test]
fn speculate_metrics_json_has_the_spec_field_order() {
    let spec = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/spec/acceptance-metrics.md"),
    )
    .or_else(|_| {
        std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/spec/acceptance-metrics.md"),
        )
    })
    .expect("shared/spec/acceptance-metrics.md beside the checkout");
    // Field names in the order of the spec's per-request table: rows "| `name` | ...".
    let section = spec
        .split("## Per request")
        .nth(1)
        .unwrap()
        .split("## In aggregate")
        .next()
        .unwrap();
    let spec_fields: Vec<&str> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let json = serde_json::to_value(samples::speculate_metrics()).unwrap();
    let ours: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let text = serde_json::to_string(&samples::speculate_metrics()).unwrap();
    let mut order: Vec<(usize, &str)> = ours
        .iter()
        .map(|k| (text.find(&format!("\"{k}\"")).unwrap(), *k))
        .collect();
    order.sort();
    let ours_in_order: Vec<&str> = order.into_iter().map(|(_, k)| k).collect();
    // The spec's fields in its order, then the additions of docs/metrics.md.
    let mut expected = spec_fields.clone();
    expected.extend(["num_offered_tokens", "predicted_accepted_tokens"]);
    assert_eq!(ours_in_order, expected);
    // Without the additions the object is exactly the spec's.
    let mut plain = samples::speculate_metrics();
    plain.num_offered_tokens = None;
    plain.predicted_accepted_tokens = None;
    let plain_json = serde_json::to_value(&plain).unwrap();
    assert_eq!(plain_json.as_object().unwrap().len(), spec_fields.len());
}

/// The additions are skipped when absent, so the MessagePack array ends early: it still
/// decodes, to the same value, with and without them.
#[test]
fn speculate_metrics_without_the_additions_round_trips() {
    let mut plain = samples::speculate_metrics();
    plain.num_offered_tokens = None;
    plain.predicted_accepted_tokens = None;
    for value in [plain, samples::speculate_metrics()] {
        let bytes = proto::encode(&value).unwrap();
        let back: proto::SpeculateMetrics = proto::decode(&bytes).unwrap();
        assert_eq!(back, value);
    }
}

#[test]
fn step_batch_validation_rejects_inconsistent_columns() {
    let good = samples::step_batch();
    good.validate(4).unwrap();
    assert_eq!(good.rows().len(), 4);
    assert!(
        good.validate(3).is_err(),
        "drafted 4 > K=3 must be rejected"
    );

    let mut b = good.clone();
    b.accepted[1] = 5;
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.token_offsets[2] = 99;
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.finish[0] = 9;
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.flags.pop();
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.starts[0].row = 17;
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.token_offsets[1] = 3;
    b.token_offsets[2] = 1;
    assert!(b.validate(8).is_err());

    // Logprobs: one per token of their row, rows in order and in range, at most 20 each.
    let rows: Vec<_> = good.rows().map(|r| r.logprobs.len()).collect();
    assert_eq!(rows, [0, 3, 0, 0]);
    let mut b = good.clone();
    b.logprobs[0].tokens.pop();
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.logprobs[0].row = 3;
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.logprobs[0].row = 4;
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.logprobs.push(b.logprobs[0].clone());
    assert!(b.validate(8).is_err(), "a row twice");
    let mut b = good.clone();
    b.logprobs[0].tokens[0].top = vec![(1, -1.0); 21];
    assert!(b.validate(8).is_err());

    // Prompt logprobs: only on prefill rows, rows in order and in range, at most 20 each.
    let rows: Vec<_> = good.rows().map(|r| r.prompt_logprobs.len()).collect();
    assert_eq!(rows, [11, 0, 0, 0]);
    let mut b = good.clone();
    b.prompt_logprobs[0].row = 1;
    assert!(b.validate(8).is_err(), "prompt logprobs on a verify row");
    let mut b = good.clone();
    b.prompt_logprobs[0].row = 4;
    assert!(b.validate(8).is_err());
    let mut b = good.clone();
    b.prompt_logprobs.push(b.prompt_logprobs[0].clone());
    assert!(b.validate(8).is_err(), "a row twice");
    let mut b = good;
    b.prompt_logprobs[0].tokens[3].top = vec![(1, -1.0); 21];
    assert!(b.validate(8).is_err());
}
