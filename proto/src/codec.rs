//! Frame encoding: MessagePack with structs as arrays (compact, and field order is the schema).

use serde::{de::DeserializeOwned, Serialize};

use crate::ProtoError;

/// Largest frame any peer sends or accepts. A 512-request step batch with K=8 is ~40 KiB and a
/// resync of a full worker a few MiB; anything larger is a bug or an attack.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// Encodes one message as a frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    let bytes = rmp_serde::to_vec(msg)?;
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(ProtoError::FrameTooLarge {
            len: bytes.len(),
            cap: MAX_FRAME_BYTES,
        });
    }
    Ok(bytes)
}

/// Decodes one frame. Never panics; allocation is bounded by the frame (serde caps
/// pre-allocation and the reader never reads past the frame), and the frame by [`MAX_FRAME_BYTES`].
pub fn decode<T: DeserializeOwned>(frame: &[u8]) -> Result<T, ProtoError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(ProtoError::FrameTooLarge {
            len: frame.len(),
            cap: MAX_FRAME_BYTES,
        });
    }
    // A cursor reader copies strings out but never allocates past the bytes actually present.
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(frame));
    let msg = T::deserialize(&mut de)?;
    let trailing = frame.len() - de.position() as usize;
    if trailing != 0 {
        return Err(ProtoError::TrailingBytes { trailing });
    }
    Ok(msg)
}
