//! Acceptance trace lines: written byte for byte as the worker wrote them before the types
//! existed, and read leniently as hand-written traces and golden cases say them.

use proto::trace::{Event, EventKind, Header, RequestName};
use proto::FinishReason;

#[test]
fn lines_are_written_as_before() {
    let header = Header {
        model: Some("toy".into()),
        num_spec_tokens: 4,
        proposer: Some("ngram".into()),
        verify_cost: Vec::new(),
        worker_id: Some("worker-a".into()),
    };
    assert_eq!(
        serde_json::to_string(&header).unwrap(),
        r#"{"model":"toy","num_spec_tokens":4,"proposer":"ngram","worker_id":"worker-a"}"#
    );
    let verify = Event {
        accepted: Some(2),
        drafted: Some(4),
        finish: Some(FinishReason::Length),
        request: RequestName::Text("1099511627776".into()),
        kind: EventKind::Verify,
        offered: None,
        step: None,
        t_us: None,
        tokens: None,
        verify_us: None,
    };
    assert_eq!(
        serde_json::to_string(&verify).unwrap(),
        r#"{"accepted":2,"drafted":4,"finish":"length","request":"1099511627776","type":"verify"}"#
    );
    let prefill = Event {
        accepted: None,
        drafted: None,
        finish: None,
        request: RequestName::Text("7".into()),
        kind: EventKind::Prefill,
        offered: None,
        step: None,
        t_us: None,
        tokens: None,
        verify_us: None,
    };
    assert_eq!(
        serde_json::to_string(&prefill).unwrap(),
        r#"{"request":"7","type":"prefill"}"#
    );
}

#[test]
fn hand_written_lines_are_read() {
    let header: Header = serde_json::from_str(r#"{"num_spec_tokens": 2}"#).unwrap();
    assert_eq!(header.num_spec_tokens, 2);
    assert_eq!(header.model, None);
    let ev: Event = serde_json::from_str(
        r#"{"type": "verify", "request": "cmpl-7", "drafted": 4, "accepted": 4, "finish": "length"}"#,
    )
    .unwrap();
    assert_eq!(ev.kind, EventKind::Verify);
    assert_eq!((ev.drafted, ev.accepted), (Some(4), Some(4)));
    assert_eq!(ev.finish, Some(FinishReason::Length));
    assert_eq!(ev.request.into_string(), "cmpl-7");
    let ev: Event = serde_json::from_str(r#"{"type": "abort", "request": 7}"#).unwrap();
    assert_eq!(ev.kind, EventKind::Abort);
    assert_eq!(ev.request.into_string(), "7");
    assert!(serde_json::from_str::<Event>(r#"{"type": "skip", "request": "a"}"#).is_err());
    assert!(serde_json::from_str::<Event>(r#"{"type": "verify"}"#).is_err());
}

/// The what-if fields (offered drafts, emitted tokens, step, times) are additions: written in
/// the same alphabetical order, and absent from the lines of older traces.
#[test]
fn what_if_fields_round_trip_in_order() {
    let verify = Event {
        accepted: Some(1),
        drafted: Some(2),
        finish: None,
        offered: Some(vec![5, 6, 7]),
        request: RequestName::Text("3".into()),
        step: Some(9),
        t_us: Some(1234),
        tokens: Some(vec![5, 8]),
        kind: EventKind::Verify,
        verify_us: Some(800),
    };
    let line = serde_json::to_string(&verify).unwrap();
    assert_eq!(
        line,
        r#"{"accepted":1,"drafted":2,"offered":[5,6,7],"request":"3","step":9,"t_us":1234,"tokens":[5,8],"type":"verify","verify_us":800}"#
    );
    assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), verify);
    let header: Header =
        serde_json::from_str(r#"{"num_spec_tokens":4,"verify_cost":[[1,0.006],[8,0.0165]]}"#)
            .unwrap();
    assert_eq!(header.verify_cost, vec![(1, 0.006), (8, 0.0165)]);
}
