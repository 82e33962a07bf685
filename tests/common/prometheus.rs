//! A real Prometheus server (Debian's `prometheus`) scraping a test stack's token-processor with
//! the project's own scrape config and rule file, and queried through its HTTP API.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How often the test server scrapes (the shipped config's 5 s, shortened so a test waits less
/// for its final values).
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

pub struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// Straight to loopback, whatever proxy the environment names.
    http: reqwest::Client,
}

impl Prometheus {
    /// Starts a server scraping the token-processor's `/metrics` on `target_port`. None when
    /// `prometheus` is not installed: the test is skipped outside the README's test command
    /// (which runs `scripts/install-test-deps.sh` and sets SPECULA_REQUIRE_TOOLS=1, so that a
    /// missing server fails the test instead).
    pub fn start(target_port: u16) -> Option<Prometheus> {
        let port = super::free_port();
        let dir = std::env::temp_dir().join(format!("specula-prom-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = write_config(&dir, target_port);
        let spawned = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                assert!(
                    std::env::var_os("SPECULA_REQUIRE_TOOLS").is_none(),
                    "prometheus not installed ({e}; scripts/install-test-deps.sh installs it)"
                );
                eprintln!("prometheus not installed; skipping (run scripts/install-test-deps.sh)");
                return None;
            }
        };
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        Some(Prometheus {
            child,
            port,
            dir,
            http,
        })
    }

    /// An instant query's result vector (at `time`, Unix seconds, or now), empty while the
    /// server is not ready; panics on an error answer.
    pub async fn query(&self, q: &str, time: Option<f64>) -> Vec<Value> {
        self.try_query(q, time)
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"))
    }

    /// [`query`](Self::query), with Prometheus' error answer (a query it cannot parse or
    /// evaluate) as `Err` instead of a panic.
    pub async fn try_query(&self, q: &str, time: Option<f64>) -> Result<Vec<Value>, String> {
        let mut params = vec![("query", q.to_string())];
        if let Some(t) = time {
            params.push(("time", format!("{t:.3}")));
        }
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        // Until Prometheus listens there is simply no data yet; until its storage is ready it
        // answers 503 with a plain-text body (slow on a cold machine), which is no data either.
        let Ok(resp) = self.http.get(url).query(&params).send().await else {
            return Ok(vec![]);
        };
        if resp.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return Ok(vec![]);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text)
            .map_err(|e| format!("Prometheus answered {status} with non-JSON ({e}): {text}"))?;
        if body["status"] != "success" {
            return Err(format!(
                "Prometheus answered {status}: {} {}",
                body["errorType"], body["error"]
            ));
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The newest raw sample `(timestamp, value)` of each series of `selector` within the last
    /// ten minutes (none before the first scrape).
    pub async fn newest_samples(&self, selector: &str) -> Vec<(f64, f64)> {
        let raw = self.query(&format!("{selector}[10m]"), None).await;
        raw.iter()
            .filter_map(|s| {
                let v = s["values"].as_array()?.last()?;
                Some((v[0].as_f64()?, v[1].as_str()?.parse::<f64>().ok()?))
            })
            .collect()
    }

    /// Waits until Prometheus holds samples of `counter` adding up to `total` and returns the
    /// newest one's timestamp. Evaluating `increase()` or `rate()` exactly there extrapolates
    /// nothing past the last sample, and nothing before the first where the counter started at
    /// 0, so the result is the counter's exact growth.
    pub async fn settled_at(&self, counter: &str, total: f64, timeout: Duration) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let newest = self.newest_samples(counter).await;
            if newest.iter().map(|(_, v)| v).sum::<f64>() == total {
                return newest.iter().map(|(t, _)| *t).fold(0.0, f64::max);
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never scraped {counter} = {total}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits for a scrape that started after Unix time `after` and returns its timestamp: what
    /// the target exported then, Prometheus holds at that instant (`series` is any series the
    /// target exports).
    pub async fn scrape_after(&self, series: &str, after: f64, timeout: Duration) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let newest = self.newest_samples(series).await;
            if let Some(t) = newest.iter().map(|(t, _)| *t).reduce(f64::max) {
                if t > after {
                    return t;
                }
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus did not scrape {series} after {after}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!("--- last lines of prometheus ---");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The project's scrape config, pointed at this test's token-processor and scraped every
/// [`SCRAPE_INTERVAL`], with its rule file beside it where the config names it, so the server
/// runs as shipped. Returns the config's path.
fn write_config(dir: &Path, target_port: u16) -> PathBuf {
    let shipped = scripts_dir().join("prometheus.yml");
    let text = std::fs::read_to_string(shipped)
        .unwrap()
        .replace("127.0.0.1:9400", &format!("127.0.0.1:{target_port}"))
        .replace(
            "scrape_interval: 5s",
            &format!("scrape_interval: {}s", SCRAPE_INTERVAL.as_secs()),
        );
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, text).unwrap();
    std::fs::copy(scripts_dir().join("alerts.yml"), dir.join("alerts.yml")).unwrap();
    config
}

/// `scripts/prometheus`: the shipped config, rules and dashboard.
pub fn scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/prometheus")
}

/// Unix time now, in seconds (Prometheus' timestamps).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
