//! Small types shared by several links.

use serde::{Deserialize, Serialize};

/// Engine request id, unique across api-servers: the api-server puts its own random 24-bit
/// prefix in the high bits and a counter in the low 40 (see the api-server's id allocator).
pub type RequestId = u64;

/// Why a request ended. Serialized as the lowercase names OpenAI clients expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the model's context length.
    Length,
    /// Aborted by the client or the api-server.
    Abort,
    /// Ended by a fault (worker death, lost step batch, ...); the output carries the error.
    Error,
}

impl FinishReason {
    pub const ALL: [FinishReason; 4] = [Self::Stop, Self::Length, Self::Abort, Self::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }

    /// Compact code used in step batches; 0 means "not finished".
    pub fn code(self) -> u8 {
        match self {
            Self::Stop => 1,
            Self::Length => 2,
            Self::Abort => 3,
            Self::Error => 4,
        }
    }

    pub fn from_code(code: u8) -> Option<Option<Self>> {
        match code {
            0 => Some(None),
            1 => Some(Some(Self::Stop)),
            2 => Some(Some(Self::Length)),
            3 => Some(Some(Self::Abort)),
            4 => Some(Some(Self::Error)),
            _ => None,
        }
    }
}

/// Most alternatives a request may ask for beside each emitted token's own logprob (OpenAI's
/// `top_logprobs` bound).
pub const MAX_TOP_LOGPROBS: u8 = 20;

/// One emitted token's log-probability under the target model's distribution (after the
/// request's logits processors, before temperature and truncation), and the `top` most likely
/// tokens there, most likely first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// Bytes it holds (for the bounds of those who keep it).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.top.len() * std::mem::size_of::<(u32, f32)>()
    }
}
