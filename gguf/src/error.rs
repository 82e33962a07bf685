use thiserror::Error;

use crate::value::ValueType;

/// Everything that can be wrong with a GGUF file or a lookup in it.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a GGUF file (magic {found:02x?})")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("corrupt file: {what} count {count} cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        remaining: u64,
    },
    #[error("unknown metadata value type {value_type} for key {key:?}")]
    UnknownValueType { key: String, value_type: u32 },
    #[error("string at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: u64 },
    #[error("metadata arrays nested deeper than {max} levels (key {key:?})")]
    NestingTooDeep { key: String, max: usize },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("duplicate tensor {0:?}")]
    DuplicateTensor(String),
    #[error("invalid general.alignment {0} (must be a non-zero power of two)")]
    BadAlignment(u64),
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("metadata key {0:?} not found")]
    MissingKey(String),
    #[error("metadata key {key:?} has type {actual}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        actual: ValueType,
    },
    #[error("metadata key {key:?}: value {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
    #[error("tensor {0:?} not found")]
    MissingTensor(String),
}
