//! Token sampling: the logits processors (penalties, bias, min_tokens), then greedy at
//! temperature 0, otherwise the target distribution after temperature, min-p, top-k and top-p,
//! drawn with a per-request, per-position RNG so that a request's tokens never depend on what
//! else is in the batch.

mod distribution;
mod logprobs;
mod processors;
mod rng;

pub use distribution::{argmax, Distribution};
pub use logprobs::{log_sum_exp, token_logprob};
pub use processors::{History, Processing};
pub use rng::position_rng;

use proto::api_worker::SamplingParams;

/// Temperature 0 (or below the point where softmax is numerically one-hot) means greedy.
pub fn is_greedy(params: &SamplingParams) -> bool {
    params.temperature <= 1e-5
}
