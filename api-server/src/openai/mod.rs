//! The OpenAI wire format: request bodies ([`requests`]), response and stream-chunk bodies
//! ([`responses`]), and the checks that turn a request into engine parameters ([`validate`]).

pub mod logprobs;
pub mod requests;
pub mod responses;
pub mod validate;
