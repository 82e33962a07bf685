//! `scripts/serve.sh` supervises like the systemd units: kill -9 each process in turn, and each
//! comes back (a new pid) while the others go on, and a request succeeds after each; SIGTERM
//! to the script stops all three. Runs the test profile's binaries (`SPECULA_BIN_DIR`), so it
//! builds nothing in release.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::openai::{complete, completion_body, stream};
use common::timing::{exit_after_kill, PATIENCE, RECOVERY};
use common::{binary, default_model, free_port, wait_until};

const NAMES: [&str; 3] = ["token-processor", "engine-worker", "api-server"];

fn pid_of(run_dir: &Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(run_dir.join(format!("{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|rest| rest.trim().to_owned()))
        .is_some_and(|rest| !rest.starts_with('Z'))
}

fn kill(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

struct Serve {
    child: Child,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sh_restarts_each_process_that_dies() {
    let bin_dir = binary("api-server").parent().unwrap().to_path_buf();
    let run_dir = std::env::temp_dir().join(format!("specula-serve-{}", free_port()));
    let (api_port, metrics_port) = (free_port(), free_port());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/serve.sh");
    let log = std::fs::File::create(std::env::temp_dir().join("specula-serve-test.log")).unwrap();
    let child = Command::new("bash")
        .arg(script)
        .env("SPECULA_BIN_DIR", &bin_dir)
        .env("SPECULA_RUN_DIR", &run_dir)
        .env("SPECULA_MODEL", default_model())
        .env("SPECULA_API_PORT", api_port.to_string())
        .env("SPECULA_METRICS_PORT", metrics_port.to_string())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut serve = Serve { child };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let api = format!("http://127.0.0.1:{api_port}");
    let healthy = |url: String| {
        let http = http.clone();
        async move {
            http.get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    };
    let all_healthy = || async {
        healthy(format!("{api}/health")).await
            && healthy(format!("http://127.0.0.1:{metrics_port}/health")).await
    };
    wait_until(Duration::from_secs(120), "serve.sh ready", all_healthy).await;
    let body = completion_body("Count: 1, 2, 3,", 4, false);
    let url = format!("{api}/v1/completions");

    for name in NAMES {
        let before = pid_of(&run_dir, name).expect("a pid file");
        kill(before, "-KILL");
        wait_until(exit_after_kill(), &format!("{name} killed"), || async {
            !alive(before)
        })
        .await;
        wait_until(PATIENCE, &format!("{name} restarted"), || async {
            pid_of(&run_dir, name).is_some_and(|pid| pid != before && alive(pid))
        })
        .await;
        wait_until(PATIENCE, "the stack healthy again", all_healthy).await;
        let mut served = false;
        let until = tokio::time::Instant::now() + RECOVERY;
        while !served && tokio::time::Instant::now() < until {
            served = complete(&http, &url, &body).await.0 == 200;
        }
        assert!(served, "no request succeeded after {name} came back");
        for other in NAMES {
            assert!(
                pid_of(&run_dir, other).is_some_and(alive),
                "{other} is running"
            );
        }
    }

    // SIGTERM to the script, with a stream in flight, stops every process it started, in the
    // units' order: the stream still ends whole (before: all three at once, and the
    // token-processor stopped carrying tokens while the others drained: an error after 30 s).
    let pids: Vec<u32> = NAMES.iter().filter_map(|n| pid_of(&run_dir, n)).collect();
    let (first_chunk_tx, first_chunk) = tokio::sync::oneshot::channel();
    let streamed = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        let mut first_chunk_tx = Some(first_chunk_tx);
        async move {
            let body = completion_body("Once upon a time", 48, true);
            stream(&http, &url, &body, |_| {
                if let Some(tx) = first_chunk_tx.take() {
                    let _ = tx.send(());
                }
                true
            })
            .await
        }
    });
    tokio::time::timeout(PATIENCE, first_chunk)
        .await
        .expect("the stream started")
        .unwrap();
    kill(serve.child.id(), "-TERM");
    let streamed = tokio::time::timeout(PATIENCE, streamed)
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(streamed.error.is_none(), "{:?}", streamed.error);
    assert_eq!(streamed.finish_reason.as_deref(), Some("length"));
    assert!(streamed.done, "the stream ended with [DONE]");
    let status = serve.child.wait().unwrap();
    assert!(!status.success(), "ended by the signal: {status}");
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived serve.sh");
    }
    let _ = std::fs::remove_dir_all(&run_dir);
}
