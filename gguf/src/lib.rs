//! A bounds-checked reader for GGUF files (versions 2 and 3), the llama.cpp model format:
//! header, metadata of every value type, tensor infos, alignment and the data section.
//!
//! Format reference: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.
//! Every length and count read from a file is checked against the bytes that remain before it
//! is used, so truncated or corrupt files give a [`GgufError`], never a panic or a huge
//! allocation.
//!
//! ```no_run
//! let file = gguf::GgufFile::open("model.gguf")?;
//! let meta = file.metadata();
//! let arch = meta.get_str("general.architecture")?;
//! let tokens = meta.get_str_array("tokenizer.ggml.tokens")?;
//! # Ok::<(), gguf::GgufError>(())
//! ```

mod error;
mod file;
mod metadata;
mod reader;
mod tensor;
mod value;
mod writer;

pub use error::GgufError;
pub use file::{GgufFile, DEFAULT_ALIGNMENT};
pub use metadata::{Metadata, OptionalKey};
pub use tensor::{GgmlType, TensorInfo};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

#[cfg(test)]
mod tests;
