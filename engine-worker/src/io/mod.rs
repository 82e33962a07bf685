//! Process wiring around the [`Engine`](crate::engine::Engine): the step loop on its own OS
//! thread, and on tokio the ZeroMQ links: a ROUTER for api-servers ([`api`]) and a DEALER to the
//! token-processor with its own reconnect loop ([`tp`]). Bounded channels connect them.

pub mod api;
mod channels;
mod status;
pub mod step_loop;
pub mod tp;

pub use channels::{ApiOutbound, EngineCommand, TpOutbound};
pub use status::WorkerStatus;
