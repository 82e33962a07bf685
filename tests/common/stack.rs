//! A whole specula stack (token-processor, engine-worker, api-server) of real binaries on
//! private ipc endpoints and free loopback ports, for cross-process tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::timing::{self, DRAIN_DEADLINE, TP_FLUSH_DEADLINE, TP_OUTAGE_WINDOW};
use super::{binary, default_model, free_port, wait_until};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proc {
    TokenProcessor,
    EngineWorker,
    ApiServer,
}

impl Proc {
    pub const ALL: [Proc; 3] = [Proc::TokenProcessor, Proc::EngineWorker, Proc::ApiServer];

    fn binary_name(self) -> &'static str {
        match self {
            Proc::TokenProcessor => "token-processor",
            Proc::EngineWorker => "engine-worker",
            Proc::ApiServer => "api-server",
        }
    }

    /// How long the process may drain on SIGTERM before it exits anyway (as the stack starts it).
    pub fn drain_deadline(self) -> Duration {
        match self {
            Proc::TokenProcessor => TP_FLUSH_DEADLINE,
            Proc::EngineWorker | Proc::ApiServer => DRAIN_DEADLINE,
        }
    }
}

/// The stack's ZeroMQ endpoints: the token-processor's two, the worker's.
pub const ZMQ_ENDPOINTS: [&str; 3] = ["tp-ingest", "tp-api", "worker-0"];

pub struct StackConfig {
    pub num_spec_tokens: u32,
    /// The worker's `--spec-policy`: `goodput` (the product's default) or `fixed`, for tests
    /// that compare a request's figures with another run's (drafting independent of load).
    pub spec_policy: &'static str,
    /// The worker's `--proposer`: `suffix` (the product's default) or `ngram`, whose drafts
    /// depend on nothing but the request's own tokens.
    pub proposer: &'static str,
    /// Extra arguments per process.
    pub worker_args: Vec<String>,
    pub api_args: Vec<String>,
    pub tp_args: Vec<String>,
    /// ZeroMQ over tcp on loopback (free ports) instead of ipc in the stack's directory.
    pub tcp: bool,
}

impl Default for StackConfig {
    fn default() -> Self {
        Self {
            num_spec_tokens: 4,
            spec_policy: "goodput",
            proposer: "suffix",
            worker_args: vec![],
            api_args: vec![],
            tp_args: vec![],
            tcp: false,
        }
    }
}

pub struct Stack {
    pub dir: PathBuf,
    pub api_port: u16,
    pub metrics_port: u16,
    config: StackConfig,
    /// With `tcp`: the port of each ZeroMQ endpoint, by name.
    tcp_ports: Vec<(&'static str, u16)>,
    children: [Option<Child>; 3],
    http: reqwest::Client,
}

impl Stack {
    /// Starts all three processes and waits until both HTTP servers report healthy.
    pub async fn start(config: StackConfig) -> Stack {
        let dir = std::env::temp_dir().join(format!(
            "specula-stack-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let tcp_ports = match config.tcp {
            true => ZMQ_ENDPOINTS
                .iter()
                .map(|&name| (name, free_port()))
                .collect(),
            false => Vec::new(),
        };
        let mut stack = Stack {
            dir,
            api_port: free_port(),
            metrics_port: free_port(),
            config,
            tcp_ports,
            children: [None, None, None],
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        };
        for p in Proc::ALL {
            stack.spawn(p);
        }
        stack.wait_healthy(Duration::from_secs(120)).await;
        stack
    }

    pub fn endpoint(&self, name: &str) -> String {
        match self.tcp_ports.iter().find(|(n, _)| *n == name) {
            Some((_, port)) => format!("tcp://127.0.0.1:{port}"),
            None => format!("ipc://{}/{name}.sock", self.dir.display()),
        }
    }

    fn index(p: Proc) -> usize {
        Proc::ALL.iter().position(|q| *q == p).unwrap()
    }

    /// (Re)starts one process with the stack's settings.
    pub fn spawn(&mut self, p: Proc) {
        let mut cmd = Command::new(binary(p.binary_name()));
        cmd.env_remove("NOTIFY_SOCKET")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", p.binary_name())))
            .unwrap();
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        let model = default_model().display().to_string();
        match p {
            Proc::TokenProcessor => {
                cmd.args(["--ingest-endpoint", &self.endpoint("tp-ingest")])
                    .args(["--api-endpoint", &self.endpoint("tp-api")])
                    .args(["--metrics-port", &self.metrics_port.to_string()])
                    .args(&self.config.tp_args);
            }
            Proc::EngineWorker => {
                cmd.args(["--model", &model])
                    .args(["--api-endpoint", &self.endpoint("worker-0")])
                    .args(["--tp-endpoint", &self.endpoint("tp-ingest")])
                    .args([
                        "--num-spec-tokens",
                        &self.config.num_spec_tokens.to_string(),
                    ])
                    .args(["--spec-policy", self.config.spec_policy])
                    .args(["--proposer", self.config.proposer])
                    .args(&self.config.worker_args);
            }
            Proc::ApiServer => {
                cmd.args(["--model", &model])
                    .args(["--port", &self.api_port.to_string()])
                    .args(["--worker-endpoints", &self.endpoint("worker-0")])
                    .args(["--tp-endpoint", &self.endpoint("tp-api")])
                    .args(&self.config.api_args);
            }
        }
        // The settings the tests derive their bounds from (`timing`), stated rather than left to
        // each binary's defaults, unless the test passes its own.
        for (flag, value) in timing_settings(p) {
            if !self.own_args(p).iter().any(|a| a == flag) {
                cmd.args([flag, &value]);
            }
        }
        self.children[Self::index(p)] = Some(cmd.spawn().unwrap());
    }

    /// The test's extra arguments for `p`.
    fn own_args(&self, p: Proc) -> &[String] {
        match p {
            Proc::TokenProcessor => &self.config.tp_args,
            Proc::EngineWorker => &self.config.worker_args,
            Proc::ApiServer => &self.config.api_args,
        }
    }

    pub fn pid(&self, p: Proc) -> u32 {
        self.children[Self::index(p)]
            .as_ref()
            .expect("process not running")
            .id()
    }

    /// The process is alive (not exited: an exited child stays a zombie until it is waited on).
    pub fn is_running(&self, p: Proc) -> bool {
        proc_stat(self.pid(p))
            .and_then(|fields| fields.first().cloned())
            .is_some_and(|state| state != "Z" && state != "X")
    }

    /// When the process started, in clock ticks since boot (`/proc/PID/stat` field 22): the
    /// same value later means the same process, not another that was given its pid.
    pub fn start_time(&self, p: Proc) -> Option<u64> {
        proc_stat(self.pid(p))?.get(19)?.parse().ok()
    }

    /// Sends a signal (e.g. "KILL", "TERM", "STOP", "CONT") to one process.
    pub fn signal(&self, p: Proc, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid(p).to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} {p:?} failed");
    }

    /// Waits for a process to exit and returns its exit code (None when killed by a signal).
    pub async fn wait_exit(&mut self, p: Proc, timeout: Duration) -> Option<i32> {
        let child = self.children[Self::index(p)]
            .as_mut()
            .expect("process not running");
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.children[Self::index(p)] = None;
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{p:?} did not exit within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn api(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.api_port)
    }

    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.metrics_port)
    }

    /// The token-processor's `/health` body (its worker lines), whatever the status.
    pub async fn tp_health_text(&self) -> String {
        self.http
            .get(format!("http://127.0.0.1:{}/health", self.metrics_port))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.http
    }

    pub async fn status(&self, url: &str) -> Option<u16> {
        self.http
            .get(url)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    pub async fn wait_healthy(&self, timeout: Duration) {
        let api = self.api("/health");
        let tp = format!("http://127.0.0.1:{}/health", self.metrics_port);
        wait_until(
            timeout,
            "api-server and token-processor /health",
            || async {
                self.status(&api).await == Some(200) && self.status(&tp).await == Some(200)
            },
        )
        .await;
    }

    /// The choices of an undisturbed run of greedy completions, one per prompt (what a request
    /// under a fault must equal if it completes).
    pub async fn reference_choices(
        &self,
        prompts: &[String],
        max_tokens: u32,
    ) -> Vec<serde_json::Value> {
        self.reference_choices_with(prompts, max_tokens, false)
            .await
    }

    /// [`reference_choices`](Self::reference_choices), optionally generating past EOS.
    pub async fn reference_choices_with(
        &self,
        prompts: &[String],
        max_tokens: u32,
        ignore_eos: bool,
    ) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for p in prompts {
            let mut request = super::openai::completion_body(p, max_tokens, false);
            request["ignore_eos"] = ignore_eos.into();
            let (status, body) =
                super::openai::complete(&self.http, &self.api("/v1/completions"), &request).await;
            assert_eq!(status, 200, "{body}");
            out.push(body["choices"][0].clone());
        }
        out
    }

    pub async fn metrics_text(&self) -> String {
        self.http
            .get(self.metrics_url())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The token-processor's `/metrics`, or "" while it does not answer (starting).
    pub async fn metrics_text_if_up(&self) -> String {
        match self.http.get(self.metrics_url()).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// One process's log so far, for assertion messages.
    pub fn log(&self, p: Proc) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", p.binary_name())))
            .unwrap_or_default()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // A failing test shows how each process ended before the logs go with the directory.
        if std::thread::panicking() {
            for p in Proc::ALL {
                let log = self.log(p);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- last lines of {} ---", p.binary_name());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `timing` settings each process is started with: (flag, value).
fn timing_settings(p: Proc) -> Vec<(&'static str, String)> {
    let secs = |d: Duration| d.as_secs().to_string();
    let mut settings = vec![("--heartbeat-interval-ms", timing::heartbeat_arg())];
    settings.extend(match p {
        Proc::TokenProcessor => vec![(
            "--shutdown-timeout-ms",
            TP_FLUSH_DEADLINE.as_millis().to_string(),
        )],
        Proc::EngineWorker => vec![("--drain-timeout-secs", secs(DRAIN_DEADLINE))],
        Proc::ApiServer => vec![
            ("--tp-outage-window-secs", secs(TP_OUTAGE_WINDOW)),
            ("--shutdown-grace-secs", secs(DRAIN_DEADLINE)),
        ],
    });
    settings
}

/// The fields of `/proc/PID/stat` from field 3 (the state) on; the command name before them is
/// parenthesised and may hold spaces.
fn proc_stat(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Sum of a Prometheus counter's samples (all label sets) in an exposition text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
