//! What the api-server and the engine-worker must agree on about a model's vocabulary, as data
//! and pure functions: how tokens spell bytes ([`bytelevel`], [`pieces`]), the bytes each token id
//! decodes to ([`TokenBytes`]), where a stop string ends the output ([`stop`]) and the name the
//! model is served under ([`model_name`]). One copy, so the two processes cannot drift apart.

pub mod bytelevel;
pub mod model_name;
pub mod pieces;
pub mod stop;
pub mod token_bytes;

pub use model_name::{served_model_name, DEFAULT_MODEL_PATH};
pub use stop::{find_completed_stop, StopMatch, StopStrings};
pub use token_bytes::{Entry, TokenBytes, VocabKind};
