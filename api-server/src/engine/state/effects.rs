//! What one input to [`super::EngineState`] asks of the links.

use link::liveness::Heard;
use proto::api_worker::{Abort, ApiToWorker, MAX_PROBE_IDS};
use proto::RequestId;

/// What a link does after handing a frame over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Reply {
    #[default]
    Nothing,
    /// Say our hello on this link now (the peer asked, or it is not alive for us).
    Hello,
}

impl From<Heard> for Reply {
    fn from(heard: Heard) -> Self {
        match heard {
            Heard::Known => Reply::Nothing,
            Heard::AskHello => Reply::Hello,
        }
    }
}

/// Frames for the workers' links, in order, and the reply on the link the input came on.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Effects {
    /// `(worker, frame)`: aborts, acknowledgements of final outputs, probes.
    pub to_workers: Vec<(usize, ApiToWorker)>,
    pub reply: Reply,
}

impl Effects {
    /// Stop request `id` at `worker`.
    pub fn abort(&mut self, worker: usize, id: RequestId) {
        self.to_workers
            .push((worker, ApiToWorker::Abort(Abort { id })));
    }

    /// Tell each worker which requests' final outputs reached us (it may forget them);
    /// `by_worker[w]` are worker `w`'s.
    pub fn delivered(&mut self, by_worker: Vec<Vec<RequestId>>) {
        self.chunked(by_worker, |ids| ApiToWorker::Delivered { ids });
    }

    /// Ask each worker about requests of ours: it replays those it holds (through a resync of
    /// the token-processor) and names those it does not.
    pub fn probe(&mut self, by_worker: Vec<Vec<RequestId>>) {
        self.chunked(by_worker, |ids| ApiToWorker::Probe { ids });
    }

    fn chunked(
        &mut self,
        by_worker: Vec<Vec<RequestId>>,
        frame: impl Fn(Vec<RequestId>) -> ApiToWorker,
    ) {
        for (worker, ids) in by_worker.into_iter().enumerate() {
            for chunk in ids.chunks(MAX_PROBE_IDS) {
                self.to_workers.push((worker, frame(chunk.to_vec())));
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.to_workers.is_empty() && self.reply == Reply::Nothing
    }
}
