//! Messages between the step loop and the I/O tasks.

use std::time::Instant;

use proto::api_worker::{AddRequest, WorkerToApi};
use proto::worker_tp::{Resync, StepBatch};
use proto::RequestId;

/// I/O → step loop.
// Most commands are requests: boxing them would cost each an allocation for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum EngineCommand {
    /// A request, with its grammar's compile when it asks for one.
    Add(AddRequest, Option<crate::engine::GrammarJob>),
    /// An api-server aborts one of its own requests.
    Abort { owner: String, id: RequestId },
    /// An api-server went silent: abort everything it owns.
    AbortOwner(String),
    /// An api-server has these requests' final outputs.
    Delivered { owner: String, ids: Vec<RequestId> },
    /// An api-server asks which of its stalled requests we no longer hold.
    Probe { owner: String, ids: Vec<RequestId> },
    /// Shutdown: finish what runs until `deadline`, abort the rest, say goodbye, stop.
    Drain { deadline: Instant },
}

/// Step loop → token-processor link, in send order.
// Nearly every message is a step: boxing it would add an allocation per step to save the
// space of the rare others.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum TpOutbound {
    Step(StepBatch),
    /// The in-flight state; the link sends a hello right before it.
    Resync(Resync),
    /// Last message: everything is finished.
    Goodbye,
}

/// Step loop → api-server link (requests the engine itself refused).
#[derive(Debug)]
pub struct ApiOutbound {
    /// `api_server_id` of the request's owner.
    pub owner: String,
    pub msg: WorkerToApi,
}
