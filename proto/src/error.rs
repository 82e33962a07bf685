use thiserror::Error;

/// Everything that can go wrong reading or writing a frame.
#[derive(Debug, Error)]
pub enum ProtoError {
    #[error("frame of {len} bytes exceeds the {cap}-byte cap")]
    FrameTooLarge { len: usize, cap: usize },
    #[error("malformed frame: {0}")]
    Malformed(#[from] rmp_serde::decode::Error),
    #[error("frame has {trailing} trailing bytes after the message")]
    TrailingBytes { trailing: usize },
    #[error("cannot encode message: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error(
        "protocol version mismatch: {peer} speaks specula protocol v{peer_version}, \
         this build speaks v{ours}"
    )]
    VersionMismatch {
        peer: String,
        peer_version: u32,
        ours: u32,
    },
    #[error("inconsistent step batch: {0}")]
    InvalidBatch(&'static str),
}
