//! The token-processor service as a library: [`TokenProcessor::start`] binds the ingest and api
//! ROUTERs and the HTTP listener, and starts the ingest, the forwarder and `/metrics`; the
//! [`Running`] service flushes and stops on [`Running::stop`]. The binary only parses
//! [`ServeConfig`], sets up tracing, memory and systemd, and waits for SIGTERM.

mod options;
mod pipeline;
mod running;

pub use options::ServeConfig;
pub use running::{Running, TokenProcessor};
