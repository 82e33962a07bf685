//! The engine client's command-line options, flattened into the api-server's: the peers it
//! dials, its stall and outage bounds and the admission bound. Each default is one const here
//! or beside what it bounds, read by the flag and by [`EngineClientConfig::new`].

use std::time::Duration;

use link::ipc::{default_tp_api_endpoint, default_worker_endpoint};
use link::Liveness;

use super::admission::{AdmissionBound, DEFAULT_REQUEST_SHARE};
use super::{EngineClientConfig, DEFAULT_ADMISSION_WAIT};

/// Seconds without output before a request is checked with its worker.
pub const DEFAULT_STALL_TIMEOUT_SECS: u64 = 30;
/// Seconds in-flight requests wait for a token-processor that is gone.
pub const DEFAULT_TP_OUTAGE_WINDOW_SECS: u64 = 30;

#[derive(Debug, Clone, clap::Args)]
pub struct EngineOptions {
    /// Engine-worker endpoints (their ROUTER sockets), comma-separated.
    #[arg(
        long,
        env = "SPECULA_WORKER_ENDPOINTS",
        value_delimiter = ',',
        default_values_t = [default_worker_endpoint()]
    )]
    pub worker_endpoints: Vec<String>,
    /// The token-processor's endpoint for api-servers (its ROUTER socket).
    #[arg(long, env = "SPECULA_TP_ENDPOINT", default_value_t = default_tp_api_endpoint())]
    pub tp_endpoint: String,
    /// A request without output for this long is checked with its worker, and ends with an
    /// error if the worker no longer holds it (a lost output never leaves it waiting).
    #[arg(long, env = "SPECULA_STALL_TIMEOUT_SECS", default_value_t = DEFAULT_STALL_TIMEOUT_SECS)]
    pub stall_timeout_secs: u64,
    /// While the token-processor is gone (restarting, paused), in-flight requests wait this long
    /// for it before they end with an error; its restart replays their outputs from the
    /// workers. New requests get a 503 meanwhile.
    #[arg(
        long,
        env = "SPECULA_TP_OUTAGE_WINDOW_SECS",
        default_value_t = DEFAULT_TP_OUTAGE_WINDOW_SECS
    )]
    pub tp_outage_window_secs: u64,
    /// This api-server's stable name; workers and the token-processor route its outputs by it
    /// (default: `api-<port>`, unique per host).
    #[arg(long, env = "SPECULA_API_SERVER_ID")]
    pub api_server_id: Option<String>,
    /// Engine sequences (prompts × n of every request) admitted at once; past it a request
    /// waits `--admission-wait-ms`, then gets a 429. 0: four times what the live workers' KV
    /// caches hold at full context, as they report it.
    #[arg(long, env = "SPECULA_MAX_SEQUENCES_IN_FLIGHT", default_value_t = 0)]
    pub max_sequences_in_flight: usize,
    /// How long a request may wait for room under the admission bound before its 429.
    #[arg(
        long,
        env = "SPECULA_ADMISSION_WAIT_MS",
        default_value_t = DEFAULT_ADMISSION_WAIT.as_millis() as u64
    )]
    pub admission_wait_ms: u64,
    /// Of the admission bound, what one request holds at once (its other choices start as its
    /// first ones end), and what one client (API key, else address) holds while another waits.
    #[arg(
        long,
        env = "SPECULA_MAX_REQUEST_SHARE",
        default_value_t = DEFAULT_REQUEST_SHARE,
        value_parser = parse_share
    )]
    pub max_request_share: f64,
}

/// A share of the admission bound: a number in (0, 1].
fn parse_share(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(share) if share > 0.0 && share <= 1.0 => Ok(share),
        _ => Err(format!("{value:?} is not a share in (0, 1]")),
    }
}

impl EngineOptions {
    /// The client's configuration: these options, this api-server's id, its heartbeat rule and
    /// the link secret it proves to its peers.
    pub fn client_config(
        &self,
        api_server_id: String,
        liveness: Liveness,
        link_secret: Option<link::auth::Secret>,
    ) -> EngineClientConfig {
        EngineClientConfig {
            liveness,
            link_secret,
            stall_timeout: Duration::from_secs(self.stall_timeout_secs.max(1)),
            tp_outage_window: Duration::from_secs(self.tp_outage_window_secs),
            admission: match self.max_sequences_in_flight {
                0 => AdmissionBound::Auto,
                n => AdmissionBound::Fixed(n),
            },
            admission_wait: Duration::from_millis(self.admission_wait_ms),
            request_share: self.max_request_share,
            ..EngineClientConfig::new(
                self.worker_endpoints.clone(),
                self.tp_endpoint.clone(),
                api_server_id,
            )
        }
    }

    /// Every peer this api-server dials (for the link secret's check).
    pub fn endpoints(&self) -> Vec<&str> {
        self.worker_endpoints
            .iter()
            .map(String::as_str)
            .chain([self.tp_endpoint.as_str()])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineOptions,
    }

    #[test]
    fn the_flags_defaults_are_the_client_configs() {
        let options = Cli::parse_from(["api-server"]).engine;
        let from_flags = options.client_config("a".into(), Liveness::default(), None);
        let direct = EngineClientConfig::new(
            vec![default_worker_endpoint()],
            default_tp_api_endpoint(),
            "a".into(),
        );
        assert_eq!(format!("{from_flags:?}"), format!("{direct:?}"));
    }

    #[test]
    fn a_share_outside_zero_to_one_is_refused() {
        for bad in ["0", "1.5", "-0.1", "x"] {
            let parsed = Cli::try_parse_from(["api-server", "--max-request-share", bad]);
            assert!(parsed.is_err(), "{bad}");
        }
        let ok = Cli::parse_from(["api-server", "--max-request-share", "1"]);
        assert_eq!(ok.engine.max_request_share, 1.0);
    }
}
