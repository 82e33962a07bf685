//! Tensor descriptions: ggml storage types and their block layouts.

use std::fmt;

/// ggml tensor storage types (codes as written in GGUF files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
    /// A code this reader does not know the layout of (IQ* formats, future types).
    Other(u32),
}

impl GgmlType {
    pub fn from_code(code: u32) -> Self {
        match code {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            24 => Self::I8,
            25 => Self::I16,
            26 => Self::I32,
            27 => Self::I64,
            28 => Self::F64,
            30 => Self::BF16,
            other => Self::Other(other),
        }
    }

    /// `(elements per block, bytes per block)`, or None for a layout this reader does not know.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        Some(match self {
            Self::F32 | Self::I32 => (1, 4),
            Self::F16 | Self::BF16 | Self::I16 => (1, 2),
            Self::I8 => (1, 1),
            Self::I64 | Self::F64 => (1, 8),
            // f16 scale + 16 bytes of nibbles.
            Self::Q4_0 => (32, 18),
            // f16 scale, f16 min + 16 bytes of nibbles.
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            // f16 scale + 32 signed bytes.
            Self::Q8_0 => (32, 34),
            Self::Q8_1 => (32, 36),
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
            Self::Q8K => (256, 292),
            Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(code) => write!(f, "ggml type {code}"),
            known => write!(f, "{known:?}"),
        }
    }
}

/// One tensor's description from the header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length. A matrix with
    /// `rows` rows of `cols` elements has `dims == [cols, rows]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes (None for an unknown storage type).
    pub size_bytes: Option<u64>,
}

impl TensorInfo {
    pub fn element_count(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Dimensions in row-major (PyTorch) order: the outermost first.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}
