//! specula's api-server: the OpenAI-compatible HTTP front end. It owns tokenization and chat
//! templates ([`tokenizer`], [`template`], [`model`]), validates requests ([`openai`],
//! [`body`]), serves the routes ([`serve`] with its HTTP limits, [`routes`], [`generate`],
//! [`stream`], [`auth`]) and talks to
//! the engine-workers and the token-processor over ZeroMQ ([`engine`]).

pub mod auth;
pub mod body;
pub mod client_key;
pub mod engine;
pub mod error;
pub mod generate;
pub mod memory;
pub mod model;
pub mod notify;
pub mod openai;
pub mod origin;
pub mod request_class;
pub mod routes;
pub mod stream;
pub mod template;
pub mod tokenizer;

pub use error::ApiError;
