//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

/// `shared/golden/acceptance`, next to the workspace.
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/acceptance")
}

/// Every golden case file (at least one, or the test would prove nothing).
pub fn golden_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("golden acceptance cases present")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no golden cases in {}",
        golden_dir().display()
    );
    files
}

/// Structural equality, numbers with relative tolerance 1e-12 (integers exactly).
pub fn assert_close(expected: &Value, got: &Value, path: &str) {
    match (expected, got) {
        (Value::Object(e), Value::Object(g)) => {
            let mut ek: Vec<_> = e.keys().collect();
            let mut gk: Vec<_> = g.keys().collect();
            ek.sort();
            gk.sort();
            assert_eq!(ek, gk, "keys differ at {path}");
            for (k, v) in e {
                assert_close(v, &g[k], &format!("{path}.{k}"));
            }
        }
        (Value::Array(e), Value::Array(g)) => {
            assert_eq!(e.len(), g.len(), "length differs at {path}");
            for (i, (a, b)) in e.iter().zip(g).enumerate() {
                assert_close(a, b, &format!("{path}[{i}]"));
            }
        }
        (Value::Number(e), Value::Number(g)) => {
            if let (Some(a), Some(b)) = (e.as_u64(), g.as_u64()) {
                assert_eq!(a, b, "at {path}");
            } else {
                let (a, b) = (e.as_f64().unwrap(), g.as_f64().unwrap());
                let tol = 1e-12 * a.abs().max(b.abs());
                assert!((a - b).abs() <= tol, "at {path}: expected {a}, got {b}");
            }
        }
        _ => assert_eq!(expected, got, "at {path}"),
    }
}
