//! The systemd units in scripts/systemd pass `systemd-analyze verify` and carry the settings the
//! services rely on (notify readiness, watchdog, independent restarts, shared ipc directory).

mod common;

use std::path::PathBuf;
use std::process::Command;

const UNITS: [(&str, &str); 3] = [
    ("specula-engine-worker.service", "engine-worker"),
    ("specula-token-processor.service", "token-processor"),
    ("specula-api-server.service", "api-server"),
];

fn unit_text(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/systemd")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

/// `systemd-analyze security` exposure (0–10) each unit stays at or under: api-server and
/// token-processor 1.5, engine-worker 3.2 (no system call filter or W^X: the CUDA driver), all
/// 6.7–7.2 "MEDIUM" before the hardening block.
const MAX_EXPOSURE: [(&str, &str); 3] = [
    ("specula-engine-worker.service", "3.5"),
    ("specula-token-processor.service", "2.0"),
    ("specula-api-server.service", "2.0"),
];

#[test]
fn units_expose_little_to_systemd_analyze_security() {
    for (unit, max) in MAX_EXPOSURE {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("scripts/systemd")
            .join(unit);
        // --threshold counts tenths of the 0–10 exposure.
        let threshold = (max.parse::<f64>().unwrap() * 10.0).round() as u32;
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(format!("--threshold={threshold}"))
            .arg(&path)
            .output()
            .expect("systemd-analyze not found: run scripts/install-test-deps.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let overall = stdout.lines().last().unwrap_or_default().to_owned();
        eprintln!("{unit}: {overall}");
        assert!(
            out.status.success(),
            "{unit} over {max}: {overall}\n{stdout}"
        );
    }
}

#[test]
fn units_pass_systemd_analyze_verify() {
    let dir = std::env::temp_dir().join(format!("specula-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut paths = Vec::new();
    for (unit, bin) in UNITS {
        // verify checks that ExecStart exists: point it at the binary this build produced.
        let text = unit_text(unit).replace(
            &format!("ExecStart=/usr/local/bin/{bin}"),
            &format!("ExecStart={}", common::binary(bin).display()),
        );
        let path = dir.join(unit);
        std::fs::write(&path, text).unwrap();
        paths.push(path);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .expect("systemd-analyze not found: run scripts/install-test-deps.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "verify failed:\n{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn units_restart_independently_and_share_the_ipc_directory() {
    for (unit, _) in UNITS {
        let text = unit_text(unit);
        for needed in [
            "Type=notify",
            "WatchdogSec=",
            "Restart=always",
            "RuntimeDirectory=specula",
            "RuntimeDirectoryMode=0750",
            "RuntimeDirectoryPreserve=yes",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "PrivateTmp=yes",
            "EnvironmentFile=",
        ] {
            assert!(text.contains(needed), "{unit} lacks {needed}");
        }
        assert!(
            !text.contains("BindsTo="),
            "{unit} must not bind its lifetime to a peer"
        );
    }
    assert!(unit_text("specula-engine-worker.service").contains("DeviceAllow=/dev/nvidia"));
}

/// systemd sends SIGKILL after `TimeoutStopSec`: it must outlast each process's own bounded
/// drain (the defaults of its flags), or the kill races the clean exit.
#[test]
fn stop_timeouts_outlast_each_drain() {
    // (unit, the process's longest shutdown with default flags, in seconds)
    for (unit, drain_secs) in [
        // --shutdown-grace-secs 30, then 2 s to close the engine links
        ("specula-api-server.service", 30 + 2),
        // --drain-timeout-secs 30, + 10 s for the link's goodbye, + 2 s for the api link
        ("specula-engine-worker.service", 30 + 10 + 2),
        // --shutdown-timeout-ms 5000, + 1 s for HTTP
        ("specula-token-processor.service", 5 + 1),
    ] {
        let text = unit_text(unit);
        let stop: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("TimeoutStopSec="))
            .unwrap_or_else(|| panic!("{unit} sets no TimeoutStopSec"))
            .trim()
            .parse()
            .unwrap();
        assert!(
            stop > drain_secs,
            "{unit}: TimeoutStopSec={stop} does not outlast its {drain_secs} s drain"
        );
    }
    for unit in [
        "specula-api-server.service",
        "specula-token-processor.service",
    ] {
        assert!(unit_text(unit).contains("LimitNOFILE="), "{unit}");
    }
}
