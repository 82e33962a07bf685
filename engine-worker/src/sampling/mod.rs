//! Token sampling: greedy at temperature 0, otherwise the target distribution after
//! temperature, top-k and top-p, drawn with a per-request, per-position RNG so that a request's
//! tokens never depend on what else is in the batch.

mod distribution;
mod rng;

pub use distribution::{argmax, Distribution};
pub use rng::position_rng;

use proto::api_worker::SamplingParams;

/// Temperature 0 (or below the point where softmax is numerically one-hot) means greedy.
pub fn is_greedy(params: &SamplingParams) -> bool {
    params.temperature <= 1e-5
}
