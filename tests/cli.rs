//! Every process documents its options, each with an environment-variable fallback.

mod common;

use std::process::Command;

fn help_of(bin: &str) -> String {
    let out = Command::new(common::binary(bin))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{bin} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_binary_documents_env_fallbacks() {
    for (bin, env) in [
        ("engine-worker", "SPECULA_NUM_SPEC_TOKENS"),
        ("token-processor", "SPECULA_METRICS_PORT"),
        ("api-server", "SPECULA_API_PORT"),
    ] {
        let help = help_of(bin);
        assert!(
            help.contains(&format!("[env: {env}")),
            "{bin} --help lacks {env}:\n{help}"
        );
    }
}

#[test]
fn binaries_report_their_version() {
    for bin in ["engine-worker", "token-processor", "api-server"] {
        let out = Command::new(common::binary(bin))
            .arg("--version")
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
    }
}
