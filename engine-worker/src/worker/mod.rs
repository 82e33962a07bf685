//! The engine-worker process as a library: [`Worker::start`] binds the api endpoint, starts the
//! links and the step-loop thread, and hands back a [`Starting`] worker whose model loads in the
//! background; [`Starting::loaded`] gives the [`Running`] worker, which a drain stops. The
//! binary only parses [`WorkerConfig`], sets up tracing and systemd, and waits.

mod build;
mod options;
mod running;
mod step_thread;

pub use options::WorkerConfig;
pub use running::{Running, Starting, Worker};
